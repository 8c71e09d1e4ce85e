"""What the ``reef`` command groups share: their options, the error wrapper, loading the
configuration, and reaching the state directory or the running server.

Every module of ``reef_core.cli`` imports from here and nothing from each other, and this
module imports click and Reef's errors only: the rest loads inside the helpers, when a
command runs, so ``reef --help`` lists every command without importing the store or a model.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import click

from ..errors import ReefError

# ------------------------------------------------------------------ options

config_option = click.option(
    "-c", "--config", "config_file", type=click.Path(exists=True, dir_okay=False),
    help="A YAML file merged over the composed config.",
)

force_store_option = click.option(
    "--force", is_flag=True,
    help="Read even though the record store given is not the one the state directory was last served with.",
)

_url = click.option("--url", envvar="REEF_URL", show_envvar=True,
                    help="The running server to send the command to (default: the one the state "
                         "directory's served-config.json names, when it runs).")
_token = click.option("--token", envvar="REEF_TOKEN", show_envvar=True,
                      help="Bearer token for the server (default: an admin token of the config given).")
_force = click.option("--force", is_flag=True,
                      help="With no server running, act even though the config given differs from "
                           "the one the state directory was last served with.")


def server_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--url``, ``--token`` and ``--force``: how a command finds the running server."""
    return _url(_token(_force(fn)))


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
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
        except OSError as exc:  # the state directory: read-only, a file where a directory should be, the disk
            click.echo(f"Error: {_os_error(exc)}", err=True)
            sys.exit(1)
        except Exception as exc:
            if type(exc).__module__.split(".")[0] != "sqlalchemy":
                raise
            # the record store refused (a read-only SQLite file, a database that went away): its
            # own words, without the statement and the link SQLAlchemy appends
            cause = getattr(exc, "orig", None) or exc
            click.echo(f"Error: the record store refused: {str(cause).splitlines()[0]}", err=True)
            sys.exit(1)

    return wrapper


def _os_error(exc: OSError) -> str:
    """One line for an OSError: what failed, on which path."""
    what = exc.strerror or str(exc) or type(exc).__name__
    where = exc.filename if exc.filename is not None else None
    return f"{what}: {where}" if where is not None else what


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if level != "debug":  # migrations announce every plugin they set up; only problems matter here
        logging.getLogger("alembic").setLevel(logging.WARNING)


# ------------------------------------------------------------------ configuration and state


def load(overrides: tuple[str, ...], config_file: str | None = None):
    """(the composed config, its validated settings, the plugins) for the command line's
    overrides and config file."""
    from ..config import compose, validate
    from ..plugins import get_plugins

    check_overrides(overrides)
    plugins = get_plugins()
    cfg = compose(list(overrides), plugins, config_file=config_file)
    settings = validate(cfg, plugins)
    return cfg, settings, plugins


def check_overrides(overrides: tuple[str, ...]) -> None:
    """A word that is not ``KEY=VALUE`` among a command's trailing arguments: say what it was
    taken as and what the command takes there (Hydra would say "Error parsing override")."""
    from ..errors import ConfigError

    for word in overrides:
        if "=" in word or word.startswith("~"):
            continue
        ctx = click.get_current_context(silent=True)
        command = f"`{ctx.command_path}`" if ctx is not None else "the command"
        message = (f"{word!r} was taken as a config override, and an override is KEY=VALUE (e.g. server.port=9000): "
                   f"{command} takes no further arguments")
        takes_scenario = ctx is not None and any("--scenario" in getattr(p, "opts", ())
                                                 for p in ctx.command.params)
        if takes_scenario:
            message += f"; for the scenario {word!r}, use -s {word}"
        raise ConfigError(message + (f" (see {ctx.command_path} --help)" if ctx is not None else ""))


def load_served(overrides: tuple[str, ...], config_file: str | None):
    """(settings, plugins, the served record or None) for a command that works on the state.

    Given overrides or a config file, they say the state directory and its
    ``served-config.json`` is the record. Given nothing, the record is the one of the state
    directory the last ``reef serve`` started in this directory served
    (``reef_core.served_dirs``), else the configured state directory's; and the settings are
    that server's, composed again from its record (``ServedConfig.recompose``), so a command
    run where ``scripts/serve`` runs uses ``runtime=local`` as the server does, silently.
    """
    from ..served_config import ServedConfig
    from ..served_dirs import state_dir_served_from

    _cfg, settings, plugins = load(overrides, config_file)
    if overrides or config_file:
        return settings, plugins, ServedConfig.read(settings.state_dir)
    served = None
    last = state_dir_served_from()
    if last is not None:
        served = ServedConfig.read(last)
    if served is None:
        served = ServedConfig.read(settings.state_dir)
    if served is not None:
        settings = served.recompose(plugins) or settings
    return settings, plugins, served


def open_store(overrides: tuple[str, ...], config_file: str | None, force: bool = False):
    """The record store of the served config (or the one given); refused when the state
    directory was served with another one (reading it would show some other store's records,
    or an empty new one)."""
    from ..errors import NotFoundError
    from ..served_config import check_given

    settings, _plugins, served = load_served(overrides, config_file)
    check_given(settings, force=force, keys=("record_store",))
    if served is None and not settings.record_store.url and not (settings.state_dir / "reef.db").exists():
        # a reader must not create a store where none was (a mistyped state directory read as empty)
        raise NotFoundError(f"no record store in {settings.state_dir}: nothing was served there "
                            "(server.state_dir names the directory `reef serve` used)")
    return settings.open_record_store(), settings


def load_with_server(overrides: tuple[str, ...], config_file: str | None, url: str | None, token: str | None):
    """(settings, plugins, the running server or None); ``load_served`` says which settings."""
    from .remote import find_server

    settings, plugins, served = load_served(overrides, config_file)
    server = find_server(settings, url=url, token=token, served=served)
    if server is not None:
        server.config_given = bool(overrides or config_file)
    return settings, plugins, server


#: what a command that only reads needs to agree with the served config on: where the state is
READ_KEYS = ("record_store", "artifact_store")


def local_kernel(settings: Any, plugins: Any, *, force: bool, learning: bool = False, read_only: bool = False):
    """A one-shot kernel on the state directory (no follower, workers or schedule), refused
    when ``settings`` differ from the served ones (for a command that only reads, ``read_only``:
    only when they name other stores); with the learning loop for ``grow``."""
    from ..compose import build_reef
    from ..served_config import LEARNING_KEYS, check_given

    check_given(settings, force=force, keys=READ_KEYS if read_only else LEARNING_KEYS)
    return build_reef(settings, plugins, background=False, learning=learning)


def say_via(server: Any, settings: Any, scenario: str) -> None:
    """Say on stderr which server does the work (and, if a config was given and differs, that
    the server's applies; with none given the server's is the one used, nothing to note)."""
    from ..served_config import note_differences

    click.echo(f"{scenario}: sent to the running server at {server.shown_url}", err=True)
    if not getattr(server, "config_given", True) or not server.served:
        return
    note = note_differences(server.served, settings)
    if note:
        click.echo(f"note: {note}", err=True)


def checked_scenario(scenario: str) -> str:
    """``scenario`` when it may name a scenario, else a usage error saying why (an empty
    ``-s "$UNSET"`` included: it must not fall back to the default scenario)."""
    from ..names import scenario_name_problem

    problem = scenario_name_problem(scenario)
    if problem:
        raise click.UsageError(problem)
    return scenario


def require_known_scenario(settings: Any, store: Any, scenario: str) -> None:
    """``NotFoundError`` for a scenario that does not exist (configured, default, named in a
    token, or with stored data), as the server answers: a typo acts on nothing."""
    from ..errors import NotFoundError
    from ..serve.scenarios import pinned_scenarios

    if scenario not in pinned_scenarios(settings) and scenario not in store.scenario_names():
        raise NotFoundError(f"no scenario named {scenario!r}")


def scenario_or_default(scenario: str | None, settings: Any, server: Any) -> str:
    """``scenario``, else the running server's default scenario, else the config's."""
    if scenario is not None:
        return checked_scenario(scenario)
    if server is not None and server.served is not None:
        return server.served.data.get("default_scenario") or settings.server.default_scenario
    return settings.server.default_scenario


def run_started(reef: Any, work: Callable[[], Awaitable[Any]]) -> Any:
    """``work()`` with ``reef`` started, stopped again afterwards."""
    import asyncio

    async def main() -> Any:
        await reef.start()
        try:
            return await work()
        finally:
            await reef.stop()

    return asyncio.run(main())
