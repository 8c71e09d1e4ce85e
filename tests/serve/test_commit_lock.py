"""The cross-process commit lock that orders the record writers of several workers."""

from __future__ import annotations

import fcntl
import os
import threading
from types import SimpleNamespace

from reef_core.serve.writer import RecordWriter, commit_lock_for
from reef_core.store import Record, RecordStore, new_id


def test_one_lock_file_per_sqlite_file_and_none_for_other_databases(tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    lock = commit_lock_for(store)
    assert lock is not None and lock.path == str(tmp_path / "r.db") + ".commit-lock"
    lock.close()
    for url in ("sqlite://", "sqlite:///:memory:", "postgresql+psycopg://reef@127.0.0.1/reef"):
        assert commit_lock_for(SimpleNamespace(url=url)) is None


def test_a_second_holder_waits_until_the_first_commits(tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    first, second = commit_lock_for(store), commit_lock_for(store)  # two workers: two descriptors
    entered = threading.Event()
    with first:
        fd = os.open(first.path, os.O_RDWR)
        try:  # held: a non-blocking attempt from another descriptor is refused
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("the lock was not exclusive")
            except BlockingIOError:
                pass
        finally:
            os.close(fd)
        waiter = threading.Thread(target=lambda: (second.__enter__(), entered.set(), second.__exit__()))
        waiter.start()
        assert not entered.wait(0.2)
    waiter.join(5)
    assert entered.is_set()
    first.close()
    second.close()


def test_writer_commits_under_the_lock_and_releases_it(tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    writer = RecordWriter(store)
    writer.start()
    rec = Record(id=new_id("rec"), scenario="s", request={"a": 1})
    writer.submit(rec)
    writer.close()
    assert store.get_record(rec.id) is not None
    lock = commit_lock_for(store)
    fd = os.open(lock.path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again once the writer is done
    os.close(fd)
    lock.close()
