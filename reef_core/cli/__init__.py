"""The ``reef`` command line: serve, inspect config and plugins, read records, run the learning
loop, coding agents as clients.

One module per command group: ``serve`` (serve, config, plugins), ``records``, ``learning``
(releases, rollback, grow, candidates), ``lineage``, ``status`` (mode, status, doctor), ``agent`` (harness,
agent) and ``reef_core.demo.cli`` (demo). What they share — options, the error wrapper, loading
the configuration, reaching the state directory or the running server (``remote``) — is in
``common``; they import nothing from each other. Plugins add commands of their own with the
``register_commands(cli)`` hook (``reef tttd run``); those are loaded only when the commands are
listed or one that is not Reef's own is named.

Trailing ``key=value`` arguments are Hydra overrides (``reef serve recipe=feedback_rules
evaluator=traffic runtime.upstream_url=http://...``). Errors are one line on stderr with exit code 2 for
configuration and plugin problems (a config other than the one the state directory was last
served with among them, ``reef_core.served_config``), 1 for the rest.
"""

from __future__ import annotations

import click

from .. import __version__
from ..demo.cli import demo
from ..errors import ReefError
from . import agent, learning, lineage, records, serve, status
from .common import configure_logging

__all__ = ["configure_logging", "main"]  # configure_logging: reef serve's runner sets up logging with it


class ReefGroup(click.Group):
    """The ``reef`` group: Reef's own commands, and those plugins add (``register_commands``),
    asked for the first time the commands are listed or a name Reef does not have is given."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._plugins_asked = False

    def _add_plugin_commands(self, ctx: click.Context, *, listing: bool) -> None:
        if self._plugins_asked:
            return
        self._plugins_asked = True
        from ..plugins import add_commands, get_plugins

        try:
            add_commands(get_plugins(), self)
        except ReefError as exc:
            if listing:  # help still lists Reef's own commands
                click.echo(f"Warning: no plugin commands: {exc}", err=True)
                return
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(exc.exit_code)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and not self._plugins_asked:
            self._add_plugin_commands(ctx, listing=False)
            command = super().get_command(ctx, cmd_name)
        return command

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._add_plugin_commands(ctx, listing=True)
        return super().list_commands(ctx)


@click.group(cls=ReefGroup)
@click.version_option(__version__, "-V", "--version", prog_name="reef")
def main() -> None:
    """Reef: an inference server that learns from the experience it serves."""


for _module in (serve, records, learning, lineage, status, agent):
    for _command in _module.COMMANDS:
        main.add_command(_command)
main.add_command(demo)  # simulated users teach the embedded model a preference (reef_core.demo)
