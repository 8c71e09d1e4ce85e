"""The ``reef`` command line: serve, inspect config and plugins, read records, run the learning
loop, coding agents as clients.

One module per command group: ``serve`` (serve, config, plugins), ``records``, ``learning``
(releases, rollback, grow, candidates), ``status`` (mode, status, doctor), ``agent`` (harness,
agent) and ``reef_core.demo.cli`` (demo). What they share — options, the error wrapper, loading
the configuration, reaching the state directory or the running server (``remote``) — is in
``common``; they import nothing from each other.

Trailing ``key=value`` arguments are Hydra overrides (``reef serve recipe=feedback_rules
runtime.upstream_url=http://...``). Errors are one line on stderr with exit code 2 for
configuration and plugin problems (a config other than the one the state directory was last
served with among them, ``reef_core.served_config``), 1 for the rest.
"""

from __future__ import annotations

import click

from .. import __version__
from ..demo.cli import demo
from . import agent, learning, records, serve, status
from .common import configure_logging

__all__ = ["configure_logging", "main"]  # configure_logging: reef serve's runner sets up logging with it


@click.group()
@click.version_option(__version__, "-V", "--version", prog_name="reef")
def main() -> None:
    """Reef: an inference server that learns from the experience it serves."""


for _module in (serve, records, learning, status, agent):
    for _command in _module.COMMANDS:
        main.add_command(_command)
main.add_command(demo)  # simulated users teach the embedded model a preference (reef_core.demo)
