"""``reef records list|show|export``: read the record store of the state directory."""

from __future__ import annotations

import json

import click

from .common import config_option, force_store_option, friendly, open_store, scenario_or_default

#: the most records `reef records list` shows (SQLite takes a limit up to 2**63 - 1)
MAX_LIST = 1_000_000


@click.group()
def records() -> None:
    """Read stored records."""


@records.command("list", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("-s", "--scenario", help="Scenario (default: server.default_scenario).")
@click.option("--status", type=click.Choice(["ok", "error", "incomplete"]))
@click.option("-n", "--limit", default=20, show_default=True, type=click.IntRange(min=1, max=MAX_LIST))
@force_store_option
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@friendly
def records_list(config_file, scenario, status, limit, force, overrides) -> None:
    """The newest records of a scenario, one per line."""
    store, settings = open_store(overrides, config_file, force)
    scenario = scenario_or_default(scenario, settings, None)
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
@config_option
@force_store_option
@click.argument("record_id")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@friendly
def records_show(config_file, force, record_id, overrides) -> None:
    """One record with its reports, as JSON."""
    from ..errors import NotFoundError
    from ..store import to_json

    store, _ = open_store(overrides, config_file, force)
    row = store.get_record(record_id)
    if row is None:
        raise NotFoundError(f"no record with receipt {record_id!r}")
    data = to_json(row)
    data["reports"] = [to_json(r) for r in store.reports_for_records([record_id])[record_id]]
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


@records.command("export", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("-s", "--scenario", help="Scenario (default: server.default_scenario).")
@click.option("-o", "--output", type=click.File("w"), default="-",
              help="File to write (default stdout); written, emptied, when there is no record.")
@force_store_option
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@friendly
def records_export(config_file, scenario, output, force, overrides) -> None:
    """Every record of a scenario, with its reports, as JSON Lines."""
    from ..store import to_json

    store, settings = open_store(overrides, config_file, force)
    scenario = scenario_or_default(scenario, settings, None)
    for rows in store.iter_record_pages(scenario):  # one page of bodies in memory at a time, not the scenario
        reports = store.reports_for_records([r.id for r in rows])
        for r in rows:
            data = to_json(r)
            data["reports"] = [to_json(x) for x in reports[r.id]]
            output.write(json.dumps(data, ensure_ascii=False) + "\n")
    output.write("")  # the file is opened (lazily, once the store is) even for no record: no stale lines left


COMMANDS = (records,)
