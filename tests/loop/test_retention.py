"""Retention removes what can never become eligible (and the records only it quotes), keeps what
a release's attribution or a running candidate needs, deletes old episodes but not the
candidate's summary, and reports what it removed. Upgrading a database from revision 0002
keeps its data. On SQLite and PostgreSQL."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import create_engine

from reef_core.compose import build_reef
from reef_core.observe import load_pool
from reef_core.plugins import get_plugins
from reef_core.store import CandidateRow, PoolRule, Record, RecordStore, Release, Report, new_id, utcnow
from reef_core.store.engine import normalize_url
from reef_core.store.migrate import current_revision, upgrade
from reef_core.testing import ReefServer

from .conftest import feedback_rules_config, settings_for, wait_for
from .test_episodes import _episodes
from .test_experience_return import Down

OLD = timedelta(days=40)


@pytest.fixture
def store(store_url):
    s = RecordStore(store_url)
    yield s
    s.close()


def _record(store: RecordStore, scenario: str = "s") -> str:
    rec = Record(id=new_id("rec"), scenario=scenario, request={"q": 1})
    store.add_record(rec)
    return rec.id


def _report(store: RecordStore, refs: list[str], *, age: timedelta = timedelta(0), scenario: str = "s") -> str:
    rpt = Report(id=new_id("rpt"), scenario=scenario, score=0.0, feedback="f", references=refs, body_hash="b",
                 created_at=utcnow() - age)
    store.add_report(rpt)
    return rpt.id


def _candidate(store: RecordStore, status: str, refs: list[str], reports: list[str], *, rejections: int = 0) -> str:
    """A candidate with ``status`` that consumed ``refs`` and ``reports``; the gate rejected it
    ``rejections`` times first (each returns them; with max_attempts 3, the third spends them)."""
    cid = new_id("cand")
    store.add_candidate(CandidateRow(id=cid, scenario="s", recipe="r", status="evaluating"))
    for _ in range(max(rejections, 1)):
        store.consume(cid, "s", record_ids=refs, report_ids=reports)
        if rejections:
            store.update_candidate(cid, status=status, decision="reject", return_experience=3)
    if not rejections:
        store.update_candidate(cid, status=status)
    return cid


def _ids(store: RecordStore, scenario: str = "s") -> tuple[set[str], set[str]]:
    return ({r.id for r in store.list_reports(scenario)}, {r.id for r in store.list_records(scenario, limit=None)})


def test_retention_removes_only_what_can_never_become_eligible(store):
    # attribution: a published candidate's experience stays, however old
    rec_pub = _record(store)
    rpt_pub = _report(store, [rec_pub], age=OLD)
    published = _candidate(store, "published", [rec_pub], [rpt_pub])
    store.add_release(Release(scenario="s", sequence=1, release_id="rel1", content_hash="h", operation="train",
                              candidate_id=published))
    # a running candidate's experience stays
    rec_run = _record(store)
    rpt_run = _report(store, [rec_run], age=OLD)
    _candidate(store, "evaluating", [rec_run], [rpt_run])
    # attempts exhausted: removed whatever its age
    rec_spent = _record(store)
    rpt_spent = _report(store, [rec_spent])
    _candidate(store, "rejected", [rec_spent], [rpt_spent], rejections=3)
    # too old: removed, unconsumed, returned or consumed by a skipped candidate alike
    rec_shared, rec_old, rec_ret, rec_skip = (_record(store) for _ in range(4))
    _report(store, [rec_shared, rec_old], age=OLD)
    rpt_ret = _report(store, [rec_ret], age=OLD)
    _candidate(store, "rejected", [rec_ret], [rpt_ret], rejections=1)
    rpt_skip = _report(store, [rec_skip], age=OLD)
    _candidate(store, "skipped", [rec_skip], [rpt_skip])
    # young and in the pool: stays, and so does the record it shares with an old report
    rpt_young = _report(store, [rec_shared])
    rec_bare = _record(store)  # quoted by no report: retention is about reports
    other = _report(store, [_record(store, "t")], age=OLD, scenario="t")

    assert store.apply_retention("s") == {"reports": 0, "records": 0}  # no limit: keep everything
    assert store.apply_retention("s", max_age_days=30) == {"reports": 4, "records": 4}
    reports, records = _ids(store)
    assert reports == {rpt_pub, rpt_run, rpt_young}
    assert records == {rec_pub, rec_run, rec_shared, rec_bare}
    assert store.consumption_states([rpt_spent, rec_spent, rpt_ret, rec_ret, rpt_skip, rec_skip]) == {}
    assert store.reports_for_records([rec_shared])[rec_shared][0].id == rpt_young
    assert {r.id for r in store.list_reports("t")} == {other}
    assert store.apply_retention("s", max_age_days=30) == {"reports": 0, "records": 0}


def test_max_reports_keeps_the_newest(store):
    reports = [_report(store, [_record(store)]) for _ in range(5)]
    rule = PoolRule(max_reports=2)
    assert [e.report_id for e in load_pool(store, "s", rule)] == reports[3:]
    assert [e.report_id for e in load_pool(store, "s", PoolRule(max_reports=9))] == reports
    assert store.apply_retention("s", max_reports=2) == {"reports": 3, "records": 3}
    assert _ids(store)[0] == set(reports[3:])


def test_old_reports_leave_the_pool(store):
    old = _report(store, [_record(store)], age=OLD)
    young = _report(store, [_record(store)])
    assert [e.report_id for e in load_pool(store, "s")] == [old, young]
    assert [e.report_id for e in load_pool(store, "s", PoolRule(max_age_days=30))] == [young]


def _kernel(tmp_path, store_url: str, retention: dict):
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always"})
    config["loop"]["retention"] = retention
    config["record_store"] = {"url": store_url}
    return build_reef(settings_for(tmp_path, Down, config), get_plugins(), background=False)


def test_the_loop_runs_retention_and_reports_it(tmp_path, store_url):
    reef = _kernel(tmp_path, store_url, {"episodes_days": 30, "max_age_days": 30, "max_reports": None})
    store = reef.store
    _report(store, [_record(store, "default")], age=OLD, scenario="default")
    old = CandidateRow(id="cand_old", scenario="default", recipe="r", status="evaluating", created_at=utcnow() - OLD)
    store.add_candidate(old)
    store.update_candidate("cand_old", status="rejected", evaluation={"metrics": {"wins": 1}}, episodes=_episodes(2, 1))
    store.add_candidate(CandidateRow(id="cand_new", scenario="default", recipe="r", status="evaluating"))
    store.update_candidate("cand_new", status="rejected", episodes=_episodes(1, 1))
    assert reef.learning.status("default")["retention"] == {"last_run": None, "removed_reports": 0,
                                                             "removed_records": 0, "removed_episodes": 0}

    removed = reef.learning.run_retention()
    assert removed == {"default": {"reports": 1, "records": 1, "episodes": 4}}
    status = reef.learning.status("default")["retention"]
    assert status["last_run"] is not None
    assert {k: v for k, v in status.items() if k != "last_run"} == {"removed_reports": 1, "removed_records": 1,
                                                                     "removed_episodes": 4}
    assert store.list_episodes("cand_old") == [] and len(store.list_episodes("cand_new")) == 2
    assert store.get_candidate("cand_old").evaluation == {"metrics": {"wins": 1}}  # the summary stays
    assert reef.learning.run_retention() == {}
    store.close()


def test_retention_runs_at_start_up_at_most_once_an_hour(tmp_path, monkeypatch):
    monkeypatch.setattr("reef_core.grow.loop.RETENTION_START_DELAY_S", 0.1)
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always"})
    config["loop"]["retention"] = {"episodes_days": 30}
    settings = settings_for(tmp_path, Down, config)

    def last_run(server):
        return server.client().get("/reef/scenarios/default").json()["loop"]["retention"]["last_run"]

    with ReefServer(tmp_path, settings=settings) as server:
        first = wait_for(lambda: last_run(server), "retention at start-up")
    with ReefServer(tmp_path, settings=settings) as server:
        time.sleep(0.5)
        assert last_run(server) is None  # it ran less than an hour ago
    assert first


def test_upgrade_from_0002_keeps_consumption_and_adds_episodes(store_url):
    engine = create_engine(normalize_url(store_url))
    upgrade(engine, "0002")
    assert current_revision(engine) == "0002"
    with engine.begin() as c:
        c.exec_driver_sql("INSERT INTO records (id, scenario, kind, status, created_at) "
                          "VALUES ('rec_old', 's', 'inference', 'ok', '2026-01-01 00:00:00')")
        c.exec_driver_sql("INSERT INTO reports (id, scenario, score, \"references\", body_hash, created_at) "
                          "VALUES ('rpt_old', 's', 0.0, '[\"rec_old\"]', 'b', '2026-01-01 00:00:00')")
        c.exec_driver_sql("INSERT INTO report_references (report_id, position, record_id) VALUES ('rpt_old', 0, 'rec_old')")
        c.exec_driver_sql("INSERT INTO candidates (id, scenario, recipe, status, created_at) "
                          "VALUES ('cand_old', 's', 'r', 'rejected', '2026-01-01 00:00:00')")
        for item, kind in (("rec_old", "record"), ("rpt_old", "report")):
            c.exec_driver_sql("INSERT INTO consumption (item_id, item_kind, candidate_id, scenario, created_at) "
                              f"VALUES ('{item}', '{kind}', 'cand_old', 's', '2026-01-01 00:00:00')")
    engine.dispose()

    store = RecordStore(store_url)
    assert current_revision(store._writer) not in (None, "0002")
    # what an earlier version consumed stays consumed, after one attempt
    assert store.consumption_states(["rec_old", "rpt_old"]) == {"rec_old": ("held", 1), "rpt_old": ("held", 1)}
    assert store.consumed(["rec_old", "rpt_old"]) == {"rec_old", "rpt_old"}
    assert load_pool(store, "s", PoolRule(retry_after_new=0)) == []
    assert store.list_reports("s")[0].references == ["rec_old"]
    store.update_candidate("cand_old", episodes=_episodes(1, 1), return_experience=3)
    assert [e["side"] for e in store.list_episodes("cand_old")] == ["candidate", "current"]
    assert [e.report_id for e in load_pool(store, "s", PoolRule(retry_after_new=0))] == ["rpt_old"]
    store.close()


def test_retention_visits_only_scenarios_with_something_to_remove(store):
    _report(store, [_record(store, "fresh")], scenario="fresh")
    _report(store, [_record(store, "old")], age=OLD, scenario="old")
    for _ in range(3):
        _report(store, [_record(store, "many")], scenario="many")
    rec = _record(store)
    rpt = _report(store, [rec])
    _candidate(store, "rejected", [rec], [rpt], rejections=3)
    assert store.retention_scenarios() == []
    assert store.retention_scenarios(max_age_days=30) == ["old", "s"]
    assert store.retention_scenarios(max_reports=2) == ["many", "s"]
    assert store.retention_scenarios(max_age_days=30, max_reports=2) == ["many", "old", "s"]
