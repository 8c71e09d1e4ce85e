"""The group-commit writer: batching, durability before resolution, isolation of bad records, flush."""

from __future__ import annotations

import asyncio
import threading

from reef_core.serve.writer import RecordWriter
from reef_core.store import Record, RecordStore, new_id


def _rec(**kw):
    return Record(id=kw.pop("id", new_id("rec")), scenario="s", **kw)


async def test_many_concurrent_writes_share_transactions(tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    sizes = []
    gate = threading.Event()
    original = store.add_records

    def slow_add(records):
        gate.wait(5)  # hold the first transaction so the rest pile up behind it
        original(records)

    store.add_records = slow_add
    w = RecordWriter(store, on_batch=lambda n, s: sizes.append(n))
    w.start()
    records = [_rec() for _ in range(50)]
    tasks = [asyncio.ensure_future(w.write(r)) for r in records]
    await asyncio.sleep(0.05)
    gate.set()
    await asyncio.gather(*tasks)
    assert sum(sizes) == 50 and len(sizes) < 50 and max(sizes) > 1
    assert len(store.get_records([r.id for r in records])) == 50
    w.close()
    store.close()


async def test_bad_record_fails_alone(tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    stored = []
    w = RecordWriter(store, on_stored=stored.append)
    w.start()
    dup = _rec()
    await w.write(dup)
    gate = threading.Event()
    original = store.add_records
    store.add_records = lambda rs: (gate.wait(5), original(rs))[1]
    good = [_rec() for _ in range(3)]
    futs = [w.submit(r) for r in [*good[:2], _rec(id=dup.id), good[2]]]
    gate.set()
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert [r is None for r in results] == [True, True, False, True]
    assert len(store.get_records([r.id for r in good])) == 3
    assert [r.id for r in stored] == [dup.id] + [r.id for r in good]
    assert w.failures == 1
    w.close()
    store.close()


def test_close_flushes_queued_records(tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    w = RecordWriter(store)
    w.start()
    records = [_rec() for _ in range(20)]
    for r in records:
        assert w.submit(r) is None  # no running loop: fire and forget
    w.close()
    assert len(store.get_records([r.id for r in records])) == 20
    store.close()


async def test_successful_records_get_their_content_hash(tmp_path):
    from reef_core.observe.experience import record_content_hash

    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    w = RecordWriter(store)
    w.start()
    same = [_rec(request={"q": 1}, response={"a": 2}, status="ok") for _ in range(2)]
    failed = _rec(request={"q": 1}, response=None, status="error")
    for r in (*same, failed):
        await w.write(r)
    rows = store.get_records([r.id for r in (*same, failed)])
    assert rows[same[0].id].content_hash == rows[same[1].id].content_hash == record_content_hash({"q": 1}, {"a": 2})
    assert rows[failed.id].content_hash is None  # errors teach nothing, dedup ignores them
    w.close()
    store.close()
