"""Ids: time first (append-mostly indexes), 80 random bits, unique across threads and forks."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from reef_core.store import ids, new_id


def test_shape_and_time_prefix():
    before = time.time_ns() // 1_000_000
    rid = new_id("rec")
    after = time.time_ns() // 1_000_000
    assert re.fullmatch(r"rec_[0-9a-f]{32}", rid)
    assert before <= int(rid[4:16], 16) <= after


def test_ids_made_later_sort_later():
    first = new_id("rec")
    time.sleep(0.002)
    assert new_id("rec") > first


def test_the_pool_is_refilled_and_never_repeats(monkeypatch):
    monkeypatch.setattr(ids, "POOL_BYTES", 3 * ids.RANDOM_BYTES)  # a refill every 3 ids
    drawn = [ids._POOL.take(ids.RANDOM_BYTES) for _ in range(50)]
    assert len(set(drawn)) == 50 and all(len(d) == ids.RANDOM_BYTES for d in drawn)


def test_unique_across_threads():
    out: list[list[str]] = [[] for _ in range(8)]

    def make(i: int) -> None:
        out[i].extend(new_id("rec") for _ in range(5000))

    threads = [threading.Thread(target=make, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [rid for chunk in out for rid in chunk]
    assert len(set(every)) == len(every) == 40000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_draws_other_bits_than_its_parent():
    new_id("rec")  # the parent's pool holds unused bits the child would otherwise copy
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next random part and leave at once
        os.write(write, ids._POOL.take(ids.RANDOM_BYTES))
        os._exit(0)
    os.close(write)
    child = os.read(read, 64)
    os.close(read)
    os.waitpid(pid, 0)
    assert child != ids._POOL.take(ids.RANDOM_BYTES)
