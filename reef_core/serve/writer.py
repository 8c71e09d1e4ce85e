"""The group-commit record writer.

Every inference produces one record, and a non-streamed response may only return once its
record is durable. Committing each record in its own transaction costs one fsync per
request; instead, requests hand records to one background thread that commits whatever
has accumulated in a single ``RecordStore.add_records`` transaction, then resolves each
request's future. Under load a batch holds many records for the price of one fsync; at
concurrency 1 a record is committed as soon as it arrives (no timer, no added wait).

Futures are resolved, and ``record_stored`` observers called, on the event loop that
submitted them, with one loop wake-up per batch.

On a SQLite file the writers of all processes (``server.workers``) take turns through an
``flock`` on a file next to the database (:mod:`reef_core.store.filelock`) before opening their
transaction. SQLite alone would make a writer that finds the write lock taken sleep in its
busy handler (1, 2, 5, 10, 15, 20, 25 ms... between retries) and retry, however soon the
lock is released: with two workers that backoff, not the disk, set the tail. A waiter on
the flock is woken the moment the other writer's commit is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import describe_error
from ..observe.experience import record_content_hash
from ..store import Record, RecordStore
from ..store.filelock import FileLock, lock_for

log = logging.getLogger("reef.writer")

_STOP = object()


class WriterClosed(RuntimeError):
    """The writer was closed; the record was not accepted."""


class RecordNotStored(RuntimeError):
    """The store refused a record; the message says why in one line (no record content)."""


def commit_lock_for(store: RecordStore) -> FileLock | None:
    """The cross-process commit lock for ``store``'s SQLite file; None for other databases
    (PostgreSQL queues writers itself, without sleeping), in-memory SQLite, or where ``flock``
    does not exist or the lock file cannot be created (SQLite's busy handler then orders
    writers, as before)."""
    return lock_for(store.url)


class RecordWriter:
    """Batches records from many requests into one transaction each."""

    def __init__(self, store: RecordStore, *, max_batch: int = 512,
                 on_stored: Callable[[Record], None] | None = None,
                 on_batch: Callable[[int, float], None] | None = None):
        self.store = store
        self.max_batch = max_batch
        self._lock = commit_lock_for(store)
        self.on_stored = on_stored
        self.on_batch = on_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.failures = 0
        #: when (monotonic) the most recent batch that stored nothing ended, and the most recent
        #: batch that stored something
        self.last_failure_at: float | None = None
        self.last_success_at: float | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def writes_failing(self, window_s: float = 30.0) -> bool:
        """Whether the latest batch stored nothing (a full disk, a store refusing every write)
        within the last ``window_s`` seconds. Readiness turns false on it; after the window it
        turns true again so that traffic can show whether the store has recovered."""
        failed = self.last_failure_at
        if failed is None or (self.last_success_at is not None and self.last_success_at > failed):
            return False
        return time.monotonic() - failed < window_s

    @property
    def died(self) -> bool:
        """The thread was started and is gone although nobody closed the writer: records can no
        longer be stored, so the process must be restarted (``/healthz`` says so)."""
        return self._thread is not None and not self._closed and not self._thread.is_alive()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="reef-record-writer", daemon=True)
            self._thread.start()

    def submit(self, record: Record) -> asyncio.Future | None:
        """Queue ``record``; the returned future resolves when it is durable (or fails).

        Called outside a running loop (or with no one to wait), returns None and the record
        is still written.
        """
        if self._closed:
            raise WriterClosed("the record writer is closed (server shutting down)")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        fut = loop.create_future() if loop is not None else None
        self._queue.put((record, fut, loop))
        return fut

    async def write(self, record: Record) -> None:
        """Queue ``record`` and wait until it is durable."""
        fut = self.submit(record)
        if fut is not None:
            await fut

    def close(self, timeout: float | None = 60) -> None:
        """Flush everything queued, then stop the thread."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            if self._lock is not None:
                self._lock.close()
                self._lock = None
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("record writer did not finish flushing within %ss", timeout)
        elif self._lock is not None:
            self._lock.close()
            self._lock = None

    def _add(self, records: list[Record]) -> None:
        with self._lock if self._lock is not None else contextlib.nullcontext():
            self.store.add_records(records)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            if item is _STOP:
                break
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)
            try:
                self._commit(batch)
            except BaseException as exc:  # noqa: BLE001 - the writer must outlive any one batch
                # Whatever went wrong, this batch's requests get an answer and the thread goes on.
                self._fail_batch(batch, exc)

    def _fail_batch(self, batch: list[tuple[Record, asyncio.Future | None, Any]], exc: BaseException) -> None:
        failure = RecordNotStored(f"the record store failed: {describe_error(exc)}")
        self.failures += len(batch)
        self.last_failure_at = time.monotonic()
        try:
            log.error("could not store a batch of %d record(s): %s", len(batch), describe_error(exc))
            self._deliver(batch, [failure] * len(batch))
        except BaseException:  # noqa: BLE001 - never let reporting kill the thread
            pass

    def _hash(self, record: Record) -> None:
        # Hashed here, off the event loop: what the dedup filter compares across candidates.
        if record.content_hash is None and record.status == "ok":
            record.content_hash = record_content_hash(record.request, record.response)

    def _store_one(self, record: Record) -> BaseException | None:
        try:
            self._hash(record)
            self._add([record])
            return None
        except Exception as exc:
            return RecordNotStored(f"the record store refused the record: {describe_error(exc)}")

    def _commit(self, batch: list[tuple[Record, asyncio.Future | None, Any]]) -> None:
        started = time.perf_counter()
        results: list[BaseException | None]
        try:
            for record, _, _ in batch:
                self._hash(record)
            self._add([r for r, _, _ in batch])
            results = [None] * len(batch)
        except Exception as exc:
            if len(batch) == 1:
                results = [RecordNotStored(f"the record store refused the record: {describe_error(exc)}")]
            else:
                # One bad record must not fail its batch-mates: retry them one by one.
                log.warning("batch of %d records failed (%s); retrying one by one", len(batch), describe_error(exc))
                results = [self._store_one(record) for record, _, _ in batch]
        for (record, _, _), res in zip(batch, results):
            if res is not None:
                self.failures += 1
                log.error("could not store record %s: %s", record.id, res)
        if all(res is not None for res in results):
            self.last_failure_at = time.monotonic()
        else:
            self.last_success_at = time.monotonic()
        if self.on_batch is not None:
            try:
                self.on_batch(len(batch), time.perf_counter() - started)
            except Exception:
                log.exception("writer batch callback failed")
        self._deliver(batch, results)

    def _deliver(self, batch: list[tuple[Record, asyncio.Future | None, Any]],
                 results: list[BaseException | None]) -> None:
        """Resolve each request's future on the loop that is waiting for it."""
        by_loop: dict[Any, list[tuple[Record, asyncio.Future | None, BaseException | None]]] = {}
        for (record, fut, loop), res in zip(batch, results):
            by_loop.setdefault(loop, []).append((record, fut, res))
        for loop, items in by_loop.items():
            if loop is None or loop.is_closed():
                self._resolve(items)
                continue
            try:
                loop.call_soon_threadsafe(self._resolve, items)
            except RuntimeError:  # the loop closed between the check and the call
                self._resolve(items)

    def _resolve(self, items: list[tuple[Record, asyncio.Future | None, BaseException | None]]) -> None:
        for record, fut, res in items:
            if fut is not None and not fut.done():
                if res is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(res)
            if res is None and self.on_stored is not None:
                try:
                    self.on_stored(record)
                except Exception:
                    log.exception("record_stored observer failed")
