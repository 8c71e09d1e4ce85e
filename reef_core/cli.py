"""The ``reef`` command line: serve, inspect config and plugins, read records.

Trailing ``key=value`` arguments are Hydra overrides (``reef serve recipe=feedback_rules
runtime.upstream_url=http://...``). Errors are one line on stderr with exit code 2 for
configuration and plugin problems (a config other than the one the state directory was last
served with among them, ``reef_core.served_config``), 1 for the rest.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import traceback
from collections.abc import Callable
from typing import Any

import click

from . import __version__
from .errors import ReefError

_config_file = click.option(
    "-c", "--config", "config_file", type=click.Path(exists=True, dir_okay=False),
    help="A YAML file merged over the composed config.",
)


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn Reef's own errors into one line on stderr and their exit code.

    ``reef serve`` raises every start-up failure as one (``StartupError`` and friends, exit 2),
    whichever plugin, runtime or extension it came from.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ReefError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


def load(overrides: tuple[str, ...], config_file: str | None = None):
    from .config import compose, validate
    from .plugins import get_plugins

    plugins = get_plugins()
    cfg = compose(list(overrides), plugins, config_file=config_file)
    settings = validate(cfg, plugins)
    return cfg, settings, plugins


@click.group()
@click.version_option(__version__, "-V", "--version", prog_name="reef")
def main() -> None:
    """Reef: an inference server that learns from the experience it serves."""


@main.command(context_settings={"ignore_unknown_options": True})
@_config_file
@click.option("--cfg", "print_cfg", type=click.Choice(["job"]), help="Print the resolved config (secrets masked) and exit.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@_friendly
def serve(config_file: str | None, print_cfg: str | None, overrides: tuple[str, ...]) -> None:
    """Run the server. OVERRIDES are Hydra overrides such as server.port=9000."""
    try:
        cfg, settings, plugins = load(overrides, config_file)
    except ReefError:
        raise
    except Exception as exc:  # a plugin failed where nothing names it (e.g. its config dir hook): still one line
        from .kernel import startup_error

        if "server.log_level=debug" in overrides:  # logging is not configured yet
            traceback.print_exc()
        raise startup_error("loading the plugins and the configuration failed", exc) from exc
    if print_cfg:
        from .config import masked_yaml

        click.echo(masked_yaml(cfg), nl=False)
        return
    from .serve.runner import run_server

    run_server(settings, plugins)


@main.command("config", context_settings={"ignore_unknown_options": True})
@_config_file
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@_friendly
def config_cmd(config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Print the resolved config with every secret masked."""
    from .config import masked_yaml

    cfg, _settings, _plugins = load(overrides, config_file)
    click.echo(masked_yaml(cfg), nl=False)


@main.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_friendly
def plugins_cmd(as_json: bool) -> None:
    """List loaded plugins and what each registered."""
    from .plugins import get_plugins

    info = get_plugins().describe()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    for p in info:
        regs = "; ".join(f"{k}: {', '.join(v)}" for k, v in p["registered"].items()) or "-"
        kind = "built-in" if p["builtin"] else f"v{p.get('version', '?')}"
        click.echo(f"{p['name']} ({kind}) {regs}")


@main.group()
def records() -> None:
    """Read stored records."""


_force_store = click.option(
    "--force", is_flag=True,
    help="Read even though the record store given is not the one the state directory was last served with.",
)


def _store(overrides: tuple[str, ...], config_file: str | None, force: bool = False):
    """The record store of the config given; refused when the state directory was served with
    another one (reading it would show some other store's records, or an empty new one)."""
    from .served_config import check_given

    _cfg, settings, _plugins = load(overrides, config_file)
    check_given(settings, force=force, keys=("record_store",))
    return settings.open_record_store(), settings


@records.command("list", context_settings={"ignore_unknown_options": True})
@_config_file
@click.option("-s", "--scenario", help="Scenario (default: server.default_scenario).")
@click.option("--status", type=click.Choice(["ok", "error", "incomplete"]))
@click.option("-n", "--limit", default=20, show_default=True)
@_force_store
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@_friendly
def records_list(config_file, scenario, status, limit, force, overrides) -> None:
    """The newest records of a scenario, one per line."""
    store, settings = _store(overrides, config_file, force)
    scenario = scenario or settings.server.default_scenario
    rows = store.list_records(scenario, status=status, limit=limit, newest_first=True, bodies=False)
    reports = store.reports_for_records([r.id for r in rows])
    for r in rows:
        scores = [rep.score for rep in reports[r.id] if rep.score is not None]
        click.echo(
            f"{r.id}  {r.created_at:%Y-%m-%d %H:%M:%S}  {r.status:<10} {r.model or '-'}  "
            f"release={r.release_id or '-'}  reports={len(reports[r.id])}"
            + (f" score={scores[-1]:g}" if scores else "")
        )


@records.command("show", context_settings={"ignore_unknown_options": True})
@_config_file
@_force_store
@click.argument("record_id")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@_friendly
def records_show(config_file, force, record_id, overrides) -> None:
    """One record with its reports, as JSON."""
    from .errors import NotFoundError
    from .store import to_json

    store, _ = _store(overrides, config_file, force)
    row = store.get_record(record_id)
    if row is None:
        raise NotFoundError(f"no record with receipt {record_id!r}")
    data = to_json(row)
    data["reports"] = [to_json(r) for r in store.reports_for_records([record_id])[record_id]]
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


@records.command("export", context_settings={"ignore_unknown_options": True})
@_config_file
@click.option("-s", "--scenario", help="Scenario (default: server.default_scenario).")
@click.option("-o", "--output", type=click.File("w"), default="-", help="File to write (default stdout).")
@_force_store
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@_friendly
def records_export(config_file, scenario, output, force, overrides) -> None:
    """Every record of a scenario, with its reports, as JSON Lines."""
    from .store import to_json

    store, settings = _store(overrides, config_file, force)
    scenario = scenario or settings.server.default_scenario
    for rows in store.iter_record_pages(scenario):  # one page of bodies in memory at a time, not the scenario
        reports = store.reports_for_records([r.id for r in rows])
        for r in rows:
            data = to_json(r)
            data["reports"] = [to_json(x) for x in reports[r.id]]
            output.write(json.dumps(data, ensure_ascii=False) + "\n")


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level != "debug":  # migrations announce every plugin they set up; only problems matter here
        logging.getLogger("alembic").setLevel(logging.WARNING)


# The learning loop's commands (releases, rollback, grow); they use the helpers above.
from .cli_learning import register_commands  # noqa: E402

register_commands(main)

# Coding agents as clients (reef harness adapters, reef agent ...).
from .cli_agent import register_commands as register_agent_commands  # noqa: E402

register_agent_commands(main)

# The learning modes, the status of every scenario and the dependency checks.
from .cli_status import register_commands as register_status_commands  # noqa: E402

register_status_commands(main)

# reef demo: simulated users teach the embedded model a preference (reef_core.demo).
from .demo.cli import demo as _demo  # noqa: E402

main.add_command(_demo)
