"""Reading a scenario's records holds one page of bodies, never the scenario's (SQLite and PostgreSQL).

Which rows a read builds is counted with SQLAlchemy's ``load`` event, per query; which columns
it selects, from the statements the reader engine runs.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager

import pytest
from click.testing import CliRunner
from sqlalchemy import event

from reef_core.cli import main
from reef_core.commit.tasks import SERVING_WINDOW, serving_conditions
from reef_core.store import Record, RecordStore, record_pages

BODY = 100_000  # bytes of request body per record
N = 12


@contextmanager
def loads_per_query():
    """{query: Record rows the ORM built from its answer}, in the order the queries ran."""
    loads: dict[object, int] = {}

    def on_load(target, context) -> None:
        loads[context] = loads.get(context, 0) + 1  # (keyed by the object: no id reuse)

    event.listen(Record, "load", on_load)
    try:
        yield loads
    finally:
        event.remove(Record, "load", on_load)


@contextmanager
def statements(store: RecordStore):
    ran: list[str] = []

    def before(conn, cursor, statement, parameters, context, executemany) -> None:
        ran.append(statement)

    event.listen(store._reader, "before_cursor_execute", before)
    try:
        yield ran
    finally:
        event.remove(store._reader, "before_cursor_execute", before)


def _big(store: RecordStore, scenario: str = "big", n: int = N) -> list[str]:
    ids = [f"{scenario}-{i:02d}" for i in range(n)]
    store.add_records([Record(id=rid, scenario=scenario, kind="inference", status="ok", route="openai.chat",
                              release_id=f"rel-{i % 3}", request={"messages": [{"content": "x" * BODY}],
                                                                   "temperature": 0.5},
                              response={"choices": [{"message": {"content": "y" * 100}}]})
                       for i, rid in enumerate(ids)])
    store.add_records([Record(id="small-0", scenario="small", request={"messages": []})])
    return ids


def test_a_whole_scenario_is_read_one_page_of_bodies_at_a_time(store_url):
    store = RecordStore(store_url)
    ids = _big(store)
    with loads_per_query() as loads:
        pages = store.iter_record_pages("big", max_bytes=int(2.5 * BODY))
        first = next(pages)
        assert [r.id for r in first] == ids[:2] and sum(loads.values()) == 2  # nothing past the first page
        rest = list(pages)
    assert [r.id for page in [first, *rest] for r in page] == ids
    assert list(loads.values()) == [2] * (N // 2)  # every query built one page's rows, never more
    newest = [r.id for r in store.iter_records("big", max_bytes=int(2.5 * BODY), newest_first=True, limit=5)]
    assert newest == ids[::-1][:5]
    only_ok = store.iter_record_pages("big", status="error", max_bytes=BODY)
    assert list(only_ok) == []


def test_a_page_ends_at_its_byte_bound(store_url):
    store = RecordStore(store_url)
    ids = _big(store)
    rows, more = store.records_page("big", limit=5, max_bytes=int(3.5 * BODY))
    assert [r.id for r in rows] == ids[:3] and more
    rows, more = store.records_page("big", limit=2, max_bytes=10 * BODY)
    assert [r.id for r in rows] == ids[:2] and more  # the row limit still holds
    rows, more = store.records_page("big", limit=50, max_bytes=10)  # one record larger than the bound: alone
    assert [r.id for r in rows] == ids[:1] and more
    rows, more = store.records_page("big", limit=50, max_bytes=100 * BODY, after_seq=store.get_record(ids[9]).seq)
    assert [r.id for r in rows] == ids[10:] and not more
    assert store.records_page("big\x00", limit=5) == ([], False)


def test_readers_that_need_no_bodies_read_none(store_url):
    store = RecordStore(store_url)
    ids = _big(store)
    with statements(store) as ran:
        listed = store.list_records("big", limit=3, newest_first=True, bodies=False)
        served_by = store.record_release_ids([*ids, "missing", "nul\x00"])
    assert [r.id for r in listed] == ids[::-1][:3] and listed[0].release_id == "rel-2"
    assert served_by == {rid: f"rel-{i % 3}" for i, rid in enumerate(ids)}
    assert ran and not any(re.search(r"records\.(request|response)\b", sql) for sql in ran), ran
    store.add_records([Record(id="resp", scenario="s", route="openai.responses", request={"input": "x" * BODY,
                                                                                       "store": False},
                              response={"object": "response", "output": []})])
    with statements(store) as ran:
        got = store.stored_response("resp")
    assert (got.scenario, got.route, got.response, got.unstored) == ("s", "openai.responses",
                                                                     {"object": "response", "output": []}, True)
    assert not any(re.search(r"(?<!\()records\.request\b(?!\s*->)", sql) for sql in ran), ran  # only its "store"
    assert store.stored_response("missing") is None and not store.stored_response("big-00").unstored
    odd = [Record(id=f"odd{i}", scenario="s", request=request) for i, request in
           enumerate([{"store": "false"}, {"store": [False]}, ["store"], "x", None, {"store": True}])]
    store.add_records(odd)
    assert [store.stored_response(r.id).unstored for r in odd] == [False] * len(odd)  # none is an error either


def test_the_cli_export_and_the_serving_window_read_by_pages(store_url, tmp_path, monkeypatch):
    store = RecordStore(store_url)
    ids = _big(store)
    monkeypatch.setattr(record_pages, "PAGE_BYTES", int(2.5 * BODY))
    out = tmp_path / "export.jsonl"
    over = [f"server.state_dir={tmp_path}", f"record_store.url={store_url}"]
    with loads_per_query() as loads:
        result = CliRunner().invoke(main, ["records", "export", "-s", "big", "-o", str(out), *over])
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ids
    assert max(loads.values()) <= 2, list(loads.values())

    class Ctx:
        scenario, dialect, serving_params = "big", "openai", None

    Ctx.store = store
    with loads_per_query() as loads:
        serving = serving_conditions(Ctx())
    assert serving.params == {"temperature": 0.5} and serving.records == min(N, SERVING_WINDOW)
    assert max(loads.values()) <= 2, list(loads.values())


@pytest.mark.parametrize("order", ["newest", "oldest"])
def test_the_records_route_pages_by_bytes(tmp_path, order):
    """``GET /reef/scenarios/{s}/records``: a page ends where its bodies pass
    ``server.max_body_bytes``; following ``next_cursor`` still gives every record once, in order."""
    from reef_core.testing import FakeUpstream, ReefServer

    with FakeUpstream("openai", lambda body: "y" * 100) as up, \
            ReefServer(tmp_path / "state", ["server.max_body_bytes=100000"], upstream=up) as reef, reef.client() as c:
        sent = []
        for i in range(6):
            r = c.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                               "content": f"{i}" + "x" * 40_000}]})
            assert r.status_code == 200
            sent.append(r.headers["x-reef-agent-record-id"])
        pages, cursor = [], None
        while True:
            page = c.get("/reef/scenarios/default/records",
                         params={"order": order, "limit": 50, **({"cursor": cursor} if cursor else {})}).json()
            pages.append([r["id"] for r in page["records"]])
            cursor = page["next_cursor"]
            if cursor is None:
                break
    assert [len(p) for p in pages] == [2, 2, 2]
    assert [rid for p in pages for rid in p] == (sent[::-1] if order == "newest" else sent)


def test_the_reports_of_a_record_are_read_up_to_a_bound(store_url):
    """Any reporter can quote one receipt in many large reports: a read of the record takes them
    up to a byte bound (the database measures them first; one at least) and counts the rest."""
    from reef_core.store import Report

    store = RecordStore(store_url)
    ids = _big(store, n=2)
    for i in range(5):
        store.add_report(Report(id=f"r{i}", scenario="big", score=0.0, feedback="f" * BODY, references=[ids[0]],
                                body_hash=f"h{i}"))
    store.add_report(Report(id="other", scenario="big", score=1.0, feedback="tiny", references=[ids[1]],
                            body_hash="h"))
    everything = store.reports_for_records(ids)
    assert [r.id for r in everything[ids[0]]] == [f"r{i}" for i in range(5)]
    reports, omitted = store.bounded_reports_for_records(ids, max_bytes=int(2.5 * BODY))
    assert [r.id for r in reports[ids[0]]] == ["r0", "r1"] and omitted == {ids[0]: 3}
    assert [r.id for r in reports[ids[1]]] == ["other"]  # every record shows at least one
    reports, omitted = store.bounded_reports_for_records(ids, max_bytes=10)
    assert [len(reports[i]) for i in ids] == [1, 1] and omitted == {ids[0]: 4}
    assert store.bounded_reports_for_records(ids, max_bytes=10 * BODY)[1] == {}
