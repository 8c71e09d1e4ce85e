"""``reef releases``, ``reef rollback`` and ``reef grow``.

They work on the local state directory and database directly (the server need not run):
the release chain's compare-and-swap and the consumption table make it safe to act while a
server runs on the same state, and a running server follows releases published elsewhere
within seconds (``reef_core.commit.serving.FOLLOW_INTERVAL_S``) and hot-swaps them in. Operating
locally also means no token is needed: whoever can read the state directory is the admin.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import click

from .cli import _config_file, _friendly, load


def _kernel(overrides: tuple[str, ...], config_file: str | None, *, learning: bool = False):
    """A one-shot kernel (no follower, workers or schedule); with the learning loop for ``grow``."""
    from .compose import build_reef

    _cfg, settings, plugins = load(overrides, config_file)
    return build_reef(settings, plugins, background=False, learning=learning)


def _run(reef: Any, work: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        await reef.start()
        try:
            return await work()
        finally:
            await reef.stop()

    return asyncio.run(main())


@click.command("releases", context_settings={"ignore_unknown_options": True})
@_config_file
@click.option("-s", "--scenario", help="Scenario (default: server.default_scenario).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@_friendly
def releases(config_file: str | None, scenario: str | None, as_json: bool, overrides: tuple[str, ...]) -> None:
    """The release chain of a scenario, newest first."""
    from rich.console import Console
    from rich.table import Table

    from .store import to_json

    reef = _kernel(overrides, config_file)
    try:
        scenario = scenario or reef.settings.server.default_scenario
        reef.releases.chain.reconcile()
        rows = reef.store.list_releases(scenario)
    finally:
        reef.store.close()
    if as_json:
        click.echo(json.dumps([to_json(r) for r in rows], indent=2))
        return
    if not rows:
        click.echo(f"scenario {scenario!r} has no releases yet")
        return
    table = Table(title=f"releases of {scenario} (--json for every field)")
    for col in ("#", "release", "operation", "content", "created"):
        table.add_column(col, no_wrap=True)
    for i, r in enumerate(rows):
        table.add_row(str(r.sequence) + (" (head)" if i == 0 else ""), r.release_id, r.operation,
                      r.content_hash[:12], f"{r.created_at:%Y-%m-%d %H:%M}")
    Console(width=max(Console().width, 100)).print(table)


@click.command("rollback", context_settings={"ignore_unknown_options": True})
@_config_file
@click.option("-s", "--scenario", help="Scenario (default: server.default_scenario).")
@click.argument("release_id")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@_friendly
def rollback(config_file: str | None, scenario: str | None, release_id: str, overrides: tuple[str, ...]) -> None:
    """Serve RELEASE_ID's content again, published as a new release (history is kept)."""
    reef = _kernel(overrides, config_file)
    scenario = scenario or reef.settings.server.default_scenario
    row = _run(reef, lambda: reef.releases.rollback(scenario, release_id))
    click.echo(f"published release {row.release_id} (#{row.sequence}) of {scenario!r}: "
               f"rollback to {release_id}, content {row.content_hash[:12]}")


@click.command("grow", context_settings={"ignore_unknown_options": True})
@_config_file
@click.option("-s", "--scenario", help="Scenario (default: server.default_scenario).")
@click.option("--json", "as_json", is_flag=True, help="Print the step's result as JSON.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@_friendly
def grow(config_file: str | None, scenario: str | None, as_json: bool, overrides: tuple[str, ...]) -> None:
    """Run one growth step now: propose from eligible experience, evaluate, publish a winner."""
    from rich.console import Console

    from .grow import RichProgress

    reef = _kernel(overrides, config_file, learning=True)
    scenario = scenario or reef.settings.server.default_scenario
    console = Console(stderr=True)

    async def work():
        with RichProgress(console) as progress:
            return await reef.learning.grow(scenario, progress)

    result = _run(reef, work)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        line = f"{scenario}: {result.outcome}"
        if result.candidate_id:
            line += f" (candidate {result.candidate_id})"
        if result.release_id:
            line += f" → release {result.release_id}"
        click.echo(line + (f": {result.reason}" if result.reason else ""))
    if result.outcome in ("error", "busy"):
        raise SystemExit(1)


def register_commands(main: click.Group) -> None:
    """Add the learning commands to the ``reef`` group."""
    for command in (releases, rollback, grow):
        main.add_command(command)
