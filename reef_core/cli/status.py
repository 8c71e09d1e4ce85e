"""``reef mode``, ``reef status`` and ``reef doctor``.

``reef mode`` and ``reef status`` go to the running server when there is one, as ``reef
grow`` does (``reef_core.cli.learning``, ``reef_core.cli.remote``), else they work on the
state directory's record store. ``reef doctor`` checks the machine against the configuration
given (``reef_core.doctor``) and needs no server.
"""

from __future__ import annotations

import getpass
import json
from typing import Any

import click

from .common import (
    checked_scenario,
    config_option,
    friendly,
    load_served,
    load_with_server,
    local_kernel,
    require_known_scenario,
    say_via,
    server_options,
)

#: candidates per scenario ``reef status`` shows
LAST_CANDIDATES = 3


def _who() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name for this uid (some containers)
        return "cli"


def _print_mode(info: dict[str, Any]) -> None:
    if info.get("since"):
        by = f", set by {info['set_by']}" if info.get("set_by") else " (from the configuration)"
        click.echo(f"{info['scenario']}: {info['mode']} since {str(info['since'])[:19].replace('T', ' ')}{by}")
    else:
        click.echo(f"{info['scenario']}: {info['mode']} (from the configuration)")


@click.command("mode", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@server_options
@click.argument("scenario")
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[MODE] [OVERRIDES]...")
@friendly
def mode(config_file: str | None, as_json: bool, url: str | None, token: str | None, force: bool, scenario: str,
         args: tuple[str, ...]) -> None:
    """Show SCENARIO's learning mode, or set it to MODE: auto (learn on reports and the
    schedule), manual (only on reef grow), paused (store, learn nothing), record_only (a
    recording proxy: what it records never becomes experience). A mode set here is stored,
    survives restarts and wins over scenarios.<name>.mode."""
    from ..config import LEARNING_MODES

    new = args[0] if args and "=" not in args[0] else None
    overrides = args[1:] if new is not None else args
    if new is not None and new not in LEARNING_MODES:
        raise click.BadParameter(f"{new!r} is not a learning mode; use one of: {', '.join(LEARNING_MODES)}",
                                 param_hint="MODE")
    checked_scenario(scenario)
    settings, _plugins, server = load_with_server(overrides, config_file, url, token)
    if server is not None:
        say_via(server, settings, scenario)
        info = server.set_mode(scenario, new, _who()) if new else server.mode(scenario)
    else:
        from ..grow.modes import ScenarioModes
        from ..served_config import check_given

        check_given(settings, force=force, keys=("record_store",))
        store = settings.open_record_store()
        try:
            require_known_scenario(settings, store, scenario)  # a typo stores no mode
            modes = ScenarioModes(store, settings)
            info = modes.set(scenario, new, _who()) if new else modes.describe(scenario)
        finally:
            store.close()
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        _print_mode(info)


def _remote_status(server: Any, scenarios: list[str]) -> list[dict[str, Any]]:
    rows = []
    for name in scenarios:
        data = server.scenario(name)
        loop = data.get("loop") or {}
        rows.append({"scenario": name, "mode": data.get("mode"), "serving_release_id": data.get("serving_release_id"),
                     "eligible": loop.get("eligible"), "state": loop.get("state"),
                     "last_candidates": [_candidate(c) for c in server.candidates(name, LAST_CANDIDATES)]})
    return rows


def _local_status(reef: Any, scenarios: list[str]) -> list[dict[str, Any]]:
    """Without a server nothing is served: the head release is what a server serves at start."""
    from ..store import to_json

    rows = []
    heads = reef.store.head_releases(scenarios)
    for name in scenarios:
        loop = reef.learning.status(name)
        rows.append({"scenario": name, "mode": loop["mode"],
                     "serving_release_id": heads[name].release_id if name in heads else None,
                     "eligible": loop["eligible"], "state": "no server",
                     "last_candidates": [_candidate(to_json(c))
                                         for c in reef.store.list_candidates(name, limit=LAST_CANDIDATES)]})
    return rows


def _candidate(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "status": row["status"], "created_at": row["created_at"],
            "release_id": row.get("release_id")}


@click.command("status", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("-s", "--scenario", "only", multiple=True, help="Only this scenario (repeatable; default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@server_options
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@friendly
def status(config_file: str | None, only: tuple[str, ...], as_json: bool, url: str | None, token: str | None,
           force: bool, overrides: tuple[str, ...]) -> None:
    """Every scenario: its learning mode, the release it serves, its eligible experience and
    its last candidates (from the running server, else from the state directory)."""
    settings, plugins, server = load_with_server(overrides, config_file, url, token)
    if server is not None:
        click.echo(f"status of the running server at {server.shown_url}", err=True)
        rows = _remote_status(server, list(only) or server.scenario_names())
    else:
        reef = local_kernel(settings, plugins, force=force, read_only=True, learning=True)
        try:
            names = list(only) or sorted({*reef.learning.configured_scenarios(), *reef.store.scenario_names()})
            rows = _local_status(reef, names)
        finally:
            reef.close_unstarted()
        click.echo("no server running: serving shows each scenario's head release, which a server serves at "
                   "start", err=True)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    _print_status(rows)


def _print_status(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="scenarios (--json for every field)")
    for col in ("scenario", "mode", "serving", "eligible", "worker", "last candidates"):
        table.add_column(col, no_wrap=col != "last candidates")
    for r in rows:
        cands = ", ".join(f"{c['id'][:13]} {c['status']}" for c in r["last_candidates"]) or "-"
        table.add_row(r["scenario"], str(r["mode"]), r["serving_release_id"] or "-",
                      "-" if r["eligible"] is None else str(r["eligible"]), str(r["state"] or "-"), cands)
    Console(width=max(Console().width, 120)).print(table)


_MARK = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]"}


@click.command("doctor", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@friendly
def doctor(config_file: str | None, as_json: bool, overrides: tuple[str, ...]) -> None:
    """Check each dependency the configuration needs (git, git-lfs, the database, the runtime
    or upstream, the model cache, free disk) and say what to do about each failure.

    Exits 1 when a required check fails."""
    from ..doctor import run_checks

    settings, plugins, _served = load_served(overrides, config_file)  # the served config, when none is given
    checks = run_checks(settings, plugins)
    if as_json:
        click.echo(json.dumps([c.to_dict() for c in checks], indent=2))
    else:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(title="reef doctor")
        for col in ("check", "", "detail", "what to do"):
            table.add_column(col)
        for c in checks:
            # details and fixes are plain text: "pip install 'reef-core[postgres]'" is not markup
            table.add_row(c.name, _MARK[c.status], Text(c.detail), Text(c.fix))
        Console(width=max(Console().width, 120)).print(table)
    if any(c.status == "fail" for c in checks):
        raise SystemExit(1)


COMMANDS = (mode, status, doctor)
