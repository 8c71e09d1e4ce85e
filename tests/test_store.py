"""The record store behaves the same on SQLite and PostgreSQL."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading

import pytest

from reef_core.errors import ConflictError, NotFoundError, StoreError
from reef_core.store import CandidateRow, Record, RecordStore, Release, Report, ScenarioMismatch
from reef_core.store.migrate import current_revision


def _report(store: RecordStore, rid: str, scenario: str, refs: list[str], score: float | None = 0.5,
            feedback: str = "fine") -> Report:
    body = {"score": score, "feedback": feedback, "references": refs}
    return Report(id=rid, scenario=scenario, score=score, feedback=feedback, references=refs,
                  body_hash=store.report_body_hash(body))


def test_records_and_reports_round_trip(store_url):
    store = RecordStore(store_url)
    assert current_revision(store._writer) is not None
    store.add_records([
        Record(id=f"r{i}", scenario="s", session="sess", tags={"k": "v"}, request={"messages": [i]},
               response={"choices": [{"message": {"content": f"answer {i}"}}]}, status="ok",
               latency_ms=1.5, usage={"total_tokens": 3}, prompt_token_ids=[1, 2],
               response_token_ids=[3], logprobs=[-0.25], adapter="s@rel1")
        for i in range(5)
    ])
    rec = store.get_record("r3")
    assert rec.request == {"messages": [3]} and rec.tags == {"k": "v"} and rec.logprobs == [-0.25]
    assert [r.id for r in store.list_records("s", limit=2)] == ["r0", "r1"]
    page2 = store.list_records("s", after_seq=store.get_record("r1").seq, limit=10)
    assert [r.id for r in page2] == ["r2", "r3", "r4"]
    assert [r.id for r in store.list_records("s", newest_first=True, limit=1)] == ["r4"]

    rep, created = store.add_report(_report(store, "rep1", "s", ["r1", "r2"]))
    assert created and rep.seq is not None
    by_rec = store.reports_for_records(["r1", "r2", "r3"])
    assert [x.id for x in by_rec["r1"]] == ["rep1"] and by_rec["r3"] == []
    assert store.get_report("rep1").references == ["r1", "r2"]
    counts = store.counts("s")
    assert counts["records"] == 5 and counts["reports"] == 1
    assert store.scenario_names() == ["s"]


def test_report_rules(store_url):
    store = RecordStore(store_url)
    store.add_records([Record(id="a", scenario="s1"), Record(id="b", scenario="s2")])
    first, created = store.add_report(_report(store, "rep", "s1", ["a"]))
    again, created_again = store.add_report(_report(store, "rep", "s1", ["a"]))
    assert created and not created_again and again.seq == first.seq
    with pytest.raises(ConflictError):
        store.add_report(_report(store, "rep", "s1", ["a"], score=1.0))
    with pytest.raises(NotFoundError, match="nope"):
        store.add_report(_report(store, "r2", "s1", ["a", "nope"]))
    with pytest.raises(ScenarioMismatch, match="s2"):
        store.add_report(_report(store, "r3", "s1", ["b"]))
    with pytest.raises(ConflictError, match="more than once"):
        store.add_report(_report(store, "r4", "s1", ["a", "a"]))
    # nothing from the refused reports was written
    assert [r.id for r in store.list_reports("s1")] == ["rep"]
    assert store.reports_for_records(["a"])["a"][0].id == "rep"


def test_consumption_is_exclusive_and_atomic(store_url):
    store = RecordStore(store_url)
    store.add_records([Record(id=i, scenario="s") for i in ("a", "b", "c")])
    store.consume("c1", "s", record_ids=["a", "b"])
    with pytest.raises(ConflictError, match="b"):
        store.consume("c2", "s", record_ids=["c", "b"])
    assert store.consumed(["a", "b", "c"]) == {"a", "b"}  # c was not half-consumed
    assert store.release_consumption("c1") == 2
    store.consume("c2", "s", record_ids=["c", "b"])
    assert store.counts("s")["consumed_records"] == 2


def test_a_candidate_and_its_batch_are_stored_together_or_not_at_all(store_url):
    """A process killed after ``consume`` leaves a candidate that holds the batch, never a
    batch held by no candidate (the next growth lease holder settles candidates)."""
    store = RecordStore(store_url)
    store.add_records([Record(id=i, scenario="s") for i in ("a", "b")])
    store.consume("c1", "s", record_ids=["a"], candidate=CandidateRow(id="c1", scenario="s", recipe="r",
                                                                     base_release_id="rel0", lease_token=7))
    row = store.get_candidate("c1")
    assert (row.status, row.base_release_id, row.lease_token) == ("proposed", "rel0", 7)
    assert store.experience_of("c1")["records"] == {"held": 1}
    with pytest.raises(ConflictError, match="a"):
        store.consume("c2", "s", record_ids=["b", "a"], candidate=CandidateRow(id="c2", scenario="s", recipe="r"))
    assert store.get_candidate("c2") is None and store.consumed(["b"]) == set()


def test_candidates_and_releases(store_url):
    store = RecordStore(store_url)
    store.add_candidate(CandidateRow(id="c1", scenario="s", recipe="r"))
    store.update_candidate("c1", status="rejected", decision="reject", reason="lost 0-3")
    got = store.get_candidate("c1")
    assert got.decision == "reject" and got.decided_at is not None
    store.add_release(Release(scenario="s", sequence=1, release_id="rel1", content_hash="h1", operation="initial"))
    with pytest.raises(ConflictError):
        store.add_release(Release(scenario="s", sequence=1, release_id="rel1b", content_hash="h", operation="train"))
    store.add_release(Release(scenario="s", sequence=2, release_id="rel2", parent_id="rel1", content_hash="h2",
                              operation="train", candidate_id="c1"))
    assert store.head_release("s").release_id == "rel2"
    assert [r.release_id for r in store.list_releases("s")] == ["rel2", "rel1"]
    assert store.head_release("other") is None


def test_concurrent_writer_threads(store_url):
    store = RecordStore(store_url)
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(25):
                store.add_record(Record(id=f"t{t}-{i}", scenario="s"))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.counts("s")["records"] == 150


WRITER = r"""
import sys
from reef_core.store import Record, RecordStore
store = RecordStore(sys.argv[1])
tag = sys.argv[2]
for i in range(int(sys.argv[3])):
    store.add_record(Record(id=f"{tag}-{i}", scenario="s", request={"i": i}))
    print(f"{tag}-{i}", flush=True)   # acknowledged: the write returned
"""


def _spawn_writer(url: str, tag: str, n: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, url, tag, str(n)], stdout=subprocess.PIPE, text=True)


def test_concurrent_writer_processes(store_url):
    RecordStore(store_url).close()  # migrate once up front, like a server start would
    procs = [_spawn_writer(store_url, f"p{k}", 40) for k in range(3)]
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0
        assert len(out.split()) == 40
    assert RecordStore(store_url).counts("s")["records"] == 120


def test_sigkill_after_acknowledged_writes_loses_nothing(store_url):
    RecordStore(store_url).close()
    proc = _spawn_writer(store_url, "k", 100_000)
    acknowledged = []
    for line in proc.stdout:
        acknowledged.append(line.strip())
        if len(acknowledged) == 60:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    store = RecordStore(store_url)
    stored = store.get_records(acknowledged)
    assert sorted(stored) == sorted(acknowledged)
    assert all(stored[i].request == {"i": int(i.split("-")[1])} for i in acknowledged)


def test_sqlite_runs_in_wal_mode(tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'x.db'}")
    with store._writer.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL


def test_report_body_hash_is_canonical():
    a = RecordStore.report_body_hash({"b": 1, "a": [1, 2], "s": math.pi})
    b = RecordStore.report_body_hash({"s": math.pi, "a": [1, 2], "b": 1})
    assert a == b and a != RecordStore.report_body_hash({"b": 2, "a": [1, 2], "s": math.pi})


def test_migrations_match_the_models(store_url):
    """A model change without a migration fails here (autogenerate would find a difference)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from sqlmodel import SQLModel

    store = RecordStore(store_url)
    with store._writer.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": False}), SQLModel.metadata)
    assert diff == []


def test_upgrade_keeps_existing_data(tmp_path):
    from alembic import command
    from sqlalchemy import create_engine

    from reef_core.store.migrate import alembic_config

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    command.upgrade(alembic_config(engine), "0001")
    with engine.begin() as c:
        c.exec_driver_sql(
            "INSERT INTO records (id, scenario, kind, status, created_at) "
            "VALUES ('old', 's', 'inference', 'ok', '2026-01-01 00:00:00')"
        )
    engine.dispose()
    store = RecordStore(url)
    row = store.get_record("old")
    assert row.scenario == "s" and row.logprobs_temperature is None and row.finish_reason is None


def test_sqlite_synchronous_normal_is_opt_in(tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'n.db'}", synchronous="normal")
    with store._writer.connect() as c:
        assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    with pytest.raises(ValueError, match="synchronous"):
        RecordStore(f"sqlite:///{tmp_path / 'x.db'}", synchronous="off")


@pytest.mark.parametrize("url", ["postgresql://reef@127.0.0.1:9/reef", "postgres://reef@127.0.0.1:9/reef",
                                 "postgresql+psycopg://reef:secret@127.0.0.1:9/reef"])
def test_a_postgresql_store_without_its_driver_says_which_extra_installs_it(monkeypatch, url):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as without reef-core[postgres]
    with pytest.raises(StoreError) as err:
        RecordStore(url)
    assert str(err.value) == "the database driver 'psycopg' is not installed: pip install 'reef-core[postgres]'"
