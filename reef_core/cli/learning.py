"""``reef releases``, ``reef rollback``, ``reef grow`` and ``reef candidates``: the learning loop.

When a server runs on the state they send the command to it over HTTP, so the server's own
configuration and learning loop do the work (``reef_core.cli.remote`` says how it is found:
``--url``/``REEF_URL``, else the state directory's ``served-config.json``). Otherwise they
work on the local state directory and database directly, with the configuration given, but
only when it is the one the state was last served with (``--force`` overrides): a step run
with another runtime or recipe would spend the feedback on nothing. The release chain's
compare-and-swap and the consumption table keep local action safe even next to a server
that could not be reached, which follows releases published elsewhere within seconds
(``reef_core.commit.serving.FOLLOW_INTERVAL_S``). Locally no token is needed: whoever can
read the state directory is the admin.
"""

from __future__ import annotations

import json
from typing import Any

import click

from .common import (
    config_option,
    force_store_option,
    friendly,
    load_with_server,
    local_kernel,
    open_store,
    require_known_scenario,
    run_started,
    say_via,
    scenario_or_default,
    server_options,
)


@click.command("releases", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("-s", "--scenario", help="Scenario (default: server.default_scenario).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@server_options
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@friendly
def releases(config_file: str | None, scenario: str | None, as_json: bool, url: str | None, token: str | None,
             force: bool, overrides: tuple[str, ...]) -> None:
    """The release chain of a scenario, newest first."""
    from rich.console import Console
    from rich.table import Table

    settings, plugins, server = load_with_server(overrides, config_file, url, token)
    scenario = scenario_or_default(scenario, settings, server)
    if server is not None:
        say_via(server, settings, scenario)
        rows = server.releases(scenario)
    else:
        from ..store import to_json  # the store only when no server answers for it

        reef = local_kernel(settings, plugins, force=force, read_only=True)
        try:
            reef.releases.chain.reconcile()
            rows = [to_json(r) for r in reef.store.list_releases(scenario)]
        finally:
            reef.store.close()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"scenario {scenario!r} has no releases yet")
        return
    table = Table(title=f"releases of {scenario} (--json for every field)")
    for col in ("#", "release", "operation", "content", "created"):
        table.add_column(col, no_wrap=True)
    for i, r in enumerate(rows):
        created = str(r["created_at"])[:16].replace("T", " ")  # ISO 8601: YYYY-MM-DD HH:MM
        table.add_row(str(r["sequence"]) + (" (head)" if i == 0 else ""), r["release_id"], r["operation"],
                      r["content_hash"][:12], created)
    Console(width=max(Console().width, 100)).print(table)


@click.command("rollback", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("-s", "--scenario", help="Scenario (default: server.default_scenario).")
@server_options
@click.argument("target", metavar="RELEASE_ID|base")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@friendly
def rollback(config_file: str | None, scenario: str | None, url: str | None, token: str | None, force: bool,
             target: str, overrides: tuple[str, ...]) -> None:
    """Serve RELEASE_ID's content again, or `base` (no harness, no adapter: the model as it is),
    published as a new release (history is kept). Nothing is published when the head already
    serves that content; either way a learner lineage of the scenario starts again from it."""
    settings, plugins, server = load_with_server(overrides, config_file, url, token)
    scenario = scenario_or_default(scenario, settings, server)
    if server is not None:
        say_via(server, settings, scenario)
        click.echo(server.rollback(scenario, target)["message"])
        return
    click.echo(_rollback_here(settings, plugins, scenario, target, force=force).message)


def _rollback_here(settings: Any, plugins: Any, scenario: str, target: str, *, force: bool):
    """Roll back on the state directory without starting the kernel: publishing and recording a
    release needs the chain only, so the runtime's model is never loaded (a server on the state
    follows the new head)."""
    import asyncio

    reef = local_kernel(settings, plugins, force=force)
    try:
        reef.releases.chain.reconcile([scenario])  # the database may lag the store after a crash
        return asyncio.run(reef.releases.rollback(scenario, target, serve=False))
    finally:
        reef.close_unstarted()


@click.command("grow", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("-s", "--scenario", help="Scenario (default: server.default_scenario).")
@click.option("--json", "as_json", is_flag=True, help="Print the step's result as JSON.")
@server_options
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@friendly
def grow(config_file: str | None, scenario: str | None, as_json: bool, url: str | None, token: str | None,
         force: bool, overrides: tuple[str, ...]) -> None:
    """Run one growth step now: propose from eligible experience, evaluate, publish a winner.

    Exits 1 when the step ends in error or another step is running, 2 for configuration problems."""
    settings, plugins, server = load_with_server(overrides, config_file, url, token)
    scenario = scenario_or_default(scenario, settings, server)
    if server is not None:
        say_via(server, settings, scenario)
        result = server.grow(scenario)
    else:
        result = _grow_here(settings, plugins, scenario, force=force)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        line = f"{scenario}: {result['outcome']}"
        if result.get("candidate_id"):
            line += f" (candidate {result['candidate_id']})"
        if result.get("release_id"):
            line += f" → release {result['release_id']}"
        click.echo(line + (f": {result['reason']}" if result.get("reason") else ""))
    if result["outcome"] in ("error", "busy"):
        raise SystemExit(1)


def _grow_here(settings: Any, plugins: Any, scenario: str, *, force: bool) -> dict[str, Any]:
    """One growth step in this process, on the state directory; refused (exit 2, nothing
    consumed) when the runtime cannot answer as configured."""
    from rich.console import Console

    from ..errors import ConfigError
    from ..grow import RichProgress

    reef = local_kernel(settings, plugins, force=force, learning=True)
    try:
        require_known_scenario(settings, reef.store, scenario)  # a typo grows nothing
    except Exception:
        reef.close_unstarted()
        raise
    problem = reef.runtime.config_problem()
    if problem:
        reef.close_unstarted()
        raise ConfigError(f"runtime {reef.runtime_name!r} cannot answer, so nothing was grown or consumed: {problem}")
    console = Console(stderr=True)

    async def work():
        with RichProgress(console) as progress:
            return await reef.learning.grow(scenario, progress)

    return run_started(reef, work).to_dict()


@click.group("candidates")
def candidates() -> None:
    """Candidates the learning loop proposed: their evaluation episodes and experience."""


@candidates.command("show", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("-s", "--scenario", help="Refuse a candidate of another scenario (default: any).")
@click.option("--json", "as_json", is_flag=True, help="Print the candidate and every episode in full, as JSON.")
@force_store_option
@click.argument("candidate_id")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@friendly
def candidates_show(config_file: str | None, scenario: str | None, as_json: bool, force: bool, candidate_id: str,
                    overrides: tuple[str, ...]) -> None:
    """One candidate: its decision, where its experience is now, and its episodes by task
    (candidate against current). Reads the record store; no server needed."""
    from ..errors import NotFoundError
    from ..store import to_json

    store, _settings = open_store(overrides, config_file, force)
    try:
        row = store.get_candidate(candidate_id)
        if row is None or (scenario and row.scenario != scenario):
            where = f" in scenario {scenario!r}" if scenario else ""
            raise NotFoundError(f"no candidate {candidate_id!r}{where}; "
                                "GET /reef/scenarios/{scenario}/candidates lists them")
        data = {"candidate": to_json(row), "experience": store.experience_of(candidate_id),
                "episodes": store.list_episodes(candidate_id)}
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print_candidate(data)


@candidates.command("export", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("-s", "--scenario", help="Scenario (default: server.default_scenario).")
@click.option("-o", "--output", type=click.File("w"), default="-", help="File to write (default stdout).")
@force_store_option
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@friendly
def candidates_export(config_file: str | None, scenario: str | None, output: Any, force: bool,
                      overrides: tuple[str, ...]) -> None:
    """Every candidate of a scenario, oldest first, with its experience and every stored
    episode, as JSON Lines (one candidate per line)."""
    from ..store import to_json

    store, settings = open_store(overrides, config_file, force)
    try:
        scenario = scenario or settings.server.default_scenario
        for row in reversed(store.list_candidates(scenario)):
            data = {"candidate": to_json(row), "experience": store.experience_of(row.id),
                    "episodes": store.list_episodes(row.id)}
            output.write(json.dumps(data, ensure_ascii=False) + "\n")
    finally:
        store.close()


def _clip(text: Any, width: int = 48) -> str:
    one_line = " ".join(str(text or "").split())
    return one_line if len(one_line) <= width else one_line[: width - 1] + "…"


def _score(episode: dict[str, Any] | None) -> str:
    if episode is None:
        return "-"
    if episode["score"] is None:
        return "crashed"
    return f"{episode['score']:g}"


def print_candidate(data: dict[str, Any]) -> None:
    """Print a candidate as ``GET /reef/scenarios/{s}/candidates/{id}`` shapes it: the
    decision, the experience by state, and a table of episodes paired by task and repeat."""
    from rich.console import Console
    from rich.table import Table

    row, episodes = data["candidate"], data["episodes"]
    click.echo(f"candidate {row['id']} of {row['scenario']} ({row['recipe']}): {row['status']}"
               + (f" — {row['reason']}" if row.get("reason") else ""))
    metrics = (row.get("evaluation") or {}).get("metrics") or {}
    shown = ", ".join(f"{k} {metrics[k]:g}" for k in ("wins", "losses", "ties", "margin", "candidate_mean",
                                                     "current_mean") if isinstance(metrics.get(k), (int, float)))
    if shown:
        click.echo(f"evaluation: {shown}")
    for kind, states in (data.get("experience") or {}).items():
        if states:
            click.echo(f"{kind}: " + ", ".join(f"{n} {state}" for state, n in sorted(states.items())))
    if not episodes:
        click.echo("no episodes stored (the evaluator kept none, or retention removed them)")
        return
    pairs: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for ep in episodes:
        pairs.setdefault((ep["task_id"], ep["repeat"]), {})[ep["side"]] = ep
    table = Table(title=f"{len(episodes)} episode(s) by task (--json for requests and full answers)")
    for col in ("task", "#", "candidate", "current", "candidate answer", "current answer"):
        table.add_column(col, no_wrap=col in ("#", "candidate", "current"))
    for (task, repeat), sides in pairs.items():
        cand, cur = sides.get("candidate"), sides.get("current")
        table.add_row(task, str(repeat), _score(cand), _score(cur),
                      _clip((cand or {}).get("answer") or (cand or {}).get("error")),
                      _clip((cur or {}).get("answer") or (cur or {}).get("error")))
    Console(width=max(Console().width, 120)).print(table)


COMMANDS = (releases, rollback, grow, candidates)
