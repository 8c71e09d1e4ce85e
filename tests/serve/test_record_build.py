"""The inference path's cheap record constructor builds what ``Record(...)`` builds."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone

from sqlmodel import select

from reef_core.serve.inference import _new_record
from reef_core.store import Record, RecordStore


def _fields(record_id: str) -> dict:
    now = datetime.now(timezone.utc)
    return dict(id=record_id, scenario="default", kind="inference", session="s1", tags={"t": "1"},
                created_at=now, finished_at=now, release_id=None, runtime="upstream", model="stub",
                route="openai.chat", request={"messages": [{"role": "user", "content": "hi"}]},
                response={"choices": [{"message": {"content": "yo"}}]}, status="ok", error=None,
                latency_ms=1.5, usage={"prompt_tokens": 1}, prompt_token_ids=[1, 2], response_token_ids=None,
                logprobs=None, logprobs_temperature=None, top_logprobs=None, finish_reason="stop", adapter=None)


def test_same_fields_defaults_and_fields_set_as_the_constructor():
    fields = _fields("rec_a")
    fast, slow = _new_record(**fields), Record(**fields)
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.seq is None and fast.content_hash is None


def test_stored_through_the_store_and_through_an_orm_session(tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    record = _new_record(**_fields("rec_core"))
    record.content_hash = "h" * 64  # set after construction, as the writer does
    store.add_records([record])
    got = store.get_record("rec_core")
    assert got is not None and got.content_hash == "h" * 64 and got.request == record.request
    with store._write() as session:  # a full ORM instance: the unit of work can insert it
        session.add(_new_record(**_fields("rec_orm")))
        session.commit()
        assert session.exec(select(Record).where(Record.id == "rec_orm")).one().usage == {"prompt_tokens": 1}


def test_readable_in_a_fresh_process(tmp_path):
    """The first record of a new worker, before anything queried the store: the ORM's mappers
    are configured by whoever builds the first instance, here the cheap constructor."""
    code = ("import sys; from datetime import datetime, timezone;"
            "from reef_core.serve.inference import _new_record;"
            "from reef_core.store import RecordStore;"
            "now = datetime.now(timezone.utc);"
            "r = _new_record(id='rec_1', scenario='s', created_at=now, request={'a': 1}, status='ok');"
            "assert r.request == {'a': 1} and r.kind == 'inference', r;"
            "store = RecordStore(sys.argv[1], migrate=True); store.add_records([r]);"
            "assert store.get_record('rec_1').request == {'a': 1}")
    done = subprocess.run([sys.executable, "-c", code, f"sqlite:///{tmp_path / 'r.db'}"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
