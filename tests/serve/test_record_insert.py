"""SQLite's record insert on the driver connection stores exactly what SQLAlchemy Core stores."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy.exc import IntegrityError

from reef_core.store import Record, RecordStore, new_id


def _records(n: int) -> list[Record]:
    now = datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=timezone.utc)
    out = []
    for i in range(n):
        out.append(Record(id=new_id("rcpt"), scenario="s", route="openai.chat", session=None if i % 2 else "sess",
                          tags=["a", "é"] if i % 2 else None, created_at=now + timedelta(seconds=i),
                          finished_at=now + timedelta(seconds=i, milliseconds=5) if i % 2 else None,
                          request={"messages": [{"role": "user", "content": f"q{i} \u2603"}]},
                          response={"choices": [{"message": {"content": "a"}}]} if i % 3 else None,
                          latency_ms=1.25 * i, usage={"prompt_tokens": i}, prompt_token_ids=[1, 2, i],
                          logprobs=[-0.5, -1.0] if i % 2 else None, status="ok" if i % 4 else "error",
                          error=None if i % 4 else "boom", content_hash=f"h{i}"))
    return out


def _raw_rows(path) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT * FROM records ORDER BY created_at").fetchall()
    finally:
        con.close()


def test_same_rows_as_the_core_insert(tmp_path):
    fast = RecordStore(f"sqlite:///{tmp_path / 'fast.db'}")
    core = RecordStore(f"sqlite:///{tmp_path / 'core.db'}")
    assert fast._insert_records is not None
    core._insert_records = None  # the SQLAlchemy Core path
    records = _records(6)
    fast.add_records(records)
    core.add_records(records)
    assert _raw_rows(tmp_path / "fast.db") == _raw_rows(tmp_path / "core.db")
    back = fast.get_records([r.id for r in records])
    for r in records:
        got = back[r.id]
        assert (got.request, got.response, got.tags, got.created_at, got.finished_at, got.latency_ms, got.error) == \
            (r.request, r.response, r.tags, r.created_at, r.finished_at, r.latency_ms, r.error)
    fast.close()
    core.close()


def test_a_failing_batch_stores_nothing_and_raises_sqlalchemy_errors(tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    first = _records(2)
    store.add_records(first)
    again = _records(3)
    again[2] = first[0]  # a duplicate id at the end of the batch
    with pytest.raises(IntegrityError):
        store.add_records(again)
    assert set(store.get_records([r.id for r in again])) == {first[0].id}
    store.add_records(again[:2])  # the connection is usable again, outside any transaction
    assert store.counts("s")["records"] == 4
    store.close()
