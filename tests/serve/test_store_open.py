"""Opening a SQLite record store from several processes at once, and the worker supervisor's
handling of a replacement that cannot open it."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from sqlalchemy.exc import OperationalError

from reef_core.store import RecordStore, engine
from reef_core.store.filelock import lock_for


def _open(path: str, barrier, results) -> None:  # noqa: ANN001 - multiprocessing primitives
    barrier.wait()
    try:
        RecordStore(f"sqlite:///{path}").close()
        results.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        results.put(f"{type(exc).__name__}: {exc}")


def test_processes_opening_one_new_store_at_once_all_succeed(tmp_path):
    ctx = multiprocessing.get_context("fork")  # the children only open a store
    for attempt in range(2):
        path = str(tmp_path / f"reef{attempt}.db")
        barrier, results = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_open, args=(path, barrier, results)) for _ in range(4)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(30)
        assert outcomes == ["ok"] * 4
        assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_opening_waits_for_the_lock_another_process_holds(tmp_path):
    url = f"sqlite:///{tmp_path / 'reef.db'}"
    RecordStore(url).close()
    holder = lock_for(url)
    opened = threading.Event()
    with holder:
        t = threading.Thread(target=lambda: (RecordStore(url).close(), opened.set()))
        t.start()
        assert not opened.wait(0.5)  # waiting on the lock, not failing
    t.join(30)
    assert opened.is_set()
    holder.close()


def test_a_locked_database_is_retried_then_other_errors_are_not(tmp_path, monkeypatch):
    from reef_core.store import migrate

    real, calls = migrate.upgrade, []

    def flaky(writer):  # noqa: ANN001
        calls.append(1)
        if len(calls) <= 2:
            raise OperationalError("PRAGMA", {}, sqlite3.OperationalError("database is locked"))
        real(writer)

    monkeypatch.setattr(migrate, "upgrade", flaky)
    store = RecordStore(f"sqlite:///{tmp_path / 'a.db'}")
    assert len(calls) == 3 and store.counts("default")["records"] == 0
    store.close()

    def broken(writer):  # noqa: ANN001
        raise OperationalError("SELECT", {}, sqlite3.OperationalError("disk I/O error"))

    monkeypatch.setattr(migrate, "upgrade", broken)
    with pytest.raises(OperationalError, match="disk I/O"):
        RecordStore(f"sqlite:///{tmp_path / 'b.db'}")


def test_a_database_locked_for_good_fails_after_the_retry_window(tmp_path, monkeypatch):
    from reef_core.store import migrate

    monkeypatch.setattr(engine, "OPEN_RETRY_S", 0.3)
    monkeypatch.setattr(migrate, "upgrade", lambda writer: (_ for _ in ()).throw(
        OperationalError("PRAGMA", {}, sqlite3.OperationalError("database is locked"))))
    with pytest.raises(OperationalError, match="locked"):
        RecordStore(f"sqlite:///{tmp_path / 'c.db'}")


_SUPERVISED = textwrap.dedent("""
    import os, sys, time
    from types import SimpleNamespace
    from reef_core.errors import StartupError
    from reef_core.serve import runner

    marks = sys.argv[1]

    def serve(settings, plugins, sock):
        # every worker leaves a mark; the test decides which ones fail to start
        n = 0
        while True:  # the n-th worker to start: the first free number
            try:
                os.close(os.open(os.path.join(marks, f"{n:03d}"), os.O_CREAT | os.O_EXCL))
                break
            except FileExistsError:
                n += 1
        open(os.path.join(marks, f"{n:03d}-{os.getpid()}"), "w").close()
        if os.path.exists(os.path.join(marks, "..", f"fail-{n}")):
            raise StartupError("the record store could not be opened: database is locked")
        while True:
            time.sleep(1)

    runner._serve = serve
    settings = SimpleNamespace(server=SimpleNamespace(host="127.0.0.1", port=0, workers=2),
                               auth=SimpleNamespace(tokens=[]))
    try:
        runner._Supervisor(settings, None).run()
    except StartupError as exc:
        print("STARTUP FAILED:", exc, flush=True)
        sys.exit(2)
""")


def _supervise(tmp_path, fail: set[int]) -> tuple[subprocess.Popen, str]:
    marks = tmp_path / "marks"
    marks.mkdir()
    for n in fail:
        (tmp_path / f"fail-{n}").touch()
    proc = subprocess.Popen([sys.executable, "-c", _SUPERVISED, str(marks)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return proc, str(marks)


def _wait_marks(marks: str, n: int, timeout: float = 60) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        names = sorted(name for name in os.listdir(marks) if "-" in name)
        if len(names) >= n:
            return [int(name.split("-")[1]) for name in names]
        time.sleep(0.05)
    raise AssertionError(f"{n} workers never started: {os.listdir(marks)}")


def test_a_replacement_that_fails_to_start_is_started_again(tmp_path):
    proc, marks = _supervise(tmp_path, fail={2})  # the first replacement fails like a locked store
    try:
        first = _wait_marks(marks, 2)
        os.kill(first[0], signal.SIGKILL)
        pids = _wait_marks(marks, 4)  # the failed replacement, then another
        assert proc.poll() is None, proc.stdout.read()
        os.kill(pids[3], 0)  # the second replacement is serving
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "STARTUP FAILED" not in out
        assert f"worker {pids[2]} exited (code 2)" in out
    finally:
        if proc.poll() is None:
            proc.kill()


_STOPPED_AS_IT_FORKS = textwrap.dedent("""
    import os, signal, sys, time
    from types import SimpleNamespace
    from reef_core.serve import runner

    def serve(settings, plugins, sock):
        while True:
            time.sleep(1)

    fork = os.fork
    def fork_then_stop():  # SIGTERM reaches the supervisor the moment its worker is forked
        pid = fork()
        if pid:
            os.kill(os.getpid(), signal.SIGTERM)
        return pid

    runner._serve, os.fork = serve, fork_then_stop
    settings = SimpleNamespace(server=SimpleNamespace(host="127.0.0.1", port=0, workers=1),
                               auth=SimpleNamespace(tokens=[]))
    runner._Supervisor(settings, None).run()
    print("STOPPED", flush=True)
""")


def test_a_stop_as_a_worker_is_forked_reaches_that_worker():
    """A SIGTERM handled between the fork and the supervisor recording the new worker would not
    be passed on to it, and the supervisor would wait on it for ever."""
    proc = subprocess.Popen([sys.executable, "-c", _STOPPED_AS_IT_FORKS], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "STOPPED" in out, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_first_worker_that_fails_to_start_stops_the_server(tmp_path):
    proc, _ = _supervise(tmp_path, fail={1})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "STARTUP FAILED" in out and "failed to start" in out
