"""``reef serve``, ``reef config`` and ``reef plugins``: run the server, and see what it would
run with.

Trailing ``key=value`` arguments are Hydra overrides (``reef serve recipe=feedback_rules
evaluator=traffic runtime.upstream_url=http://...``).
"""

from __future__ import annotations

import json
import traceback

import click

from ..errors import ReefError
from .common import config_option, friendly, load


@click.command(context_settings={"ignore_unknown_options": True})
@config_option
@click.option("--cfg", "print_cfg", type=click.Choice(["job"]), help="Print the resolved config (secrets masked) and exit.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@friendly
def serve(config_file: str | None, print_cfg: str | None, overrides: tuple[str, ...]) -> None:
    """Run the server. OVERRIDES are Hydra overrides such as server.port=9000."""
    try:
        cfg, settings, plugins = load(overrides, config_file)
    except ReefError:
        raise
    except Exception as exc:  # a plugin failed where nothing names it (e.g. its config dir hook): still one line
        from ..kernel import startup_error

        if "server.log_level=debug" in overrides:  # logging is not configured yet
            traceback.print_exc()
        raise startup_error("loading the plugins and the configuration failed", exc) from exc
    if print_cfg:
        from ..config import masked_yaml

        click.echo(masked_yaml(cfg), nl=False)
        return
    from ..serve.runner import run_server
    from ..served_config import record_composition

    record_composition(config_file, overrides)  # a command run here with no arguments composes it again
    run_server(settings, plugins)


@click.command("config", context_settings={"ignore_unknown_options": True})
@config_option
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@friendly
def config_cmd(config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Print the resolved config with every secret masked."""
    from ..config import masked_yaml

    cfg, _settings, _plugins = load(overrides, config_file)
    click.echo(masked_yaml(cfg), nl=False)


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@friendly
def plugins_cmd(as_json: bool) -> None:
    """List loaded plugins and what each registered."""
    from ..plugins import get_plugins

    info = get_plugins().describe()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    for p in info:
        regs = "; ".join(f"{k}: {', '.join(v)}" for k, v in p["registered"].items()) or "-"
        kind = "built-in" if p["builtin"] else f"v{p.get('version', '?')}"
        click.echo(f"{p['name']} ({kind}) {regs}")


COMMANDS = (serve, config_cmd, plugins_cmd)
