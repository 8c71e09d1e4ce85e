"""Growth leases of one process: one growth step per scenario at a time across every process
sharing the record store, with fencing.

A step runs only while its process holds the scenario's lease (``reef_core.store.leases``):
``Leases.hold`` acquires it, renews it every third of ``loop.lease_ttl_s`` while the step runs
and releases it afterwards. The candidate records the lease's fencing token, and publishing
re-checks it under the lease row's lock (``RecordStore.fenced``), so a step whose process lost
the lease (paused or partitioned past the expiry) ends ``fenced`` and never publishes.

Recovery: unsettled candidates of a scenario are settled only by a process that holds the
scenario's lease with a newer token (``settle_ended_steps``): their holder's lease ended, so
they can never publish. The release chain is caught up first: a release the dead step put in
the artifact store but not in the database is recorded and its candidate marked published, so
its experience is never handed out again. A lease held by a dead process of this host (same
host and PID namespace, its PID gone) is taken over at once rather than after its expiry.

Cross-process triggers: on PostgreSQL, releasing a lease ``NOTIFY``s every listening process
(``LeaseListener``), whose workers check their scenario again; on SQLite a worker that found
the lease held retries every ``loop.lease_poll_s`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from ..commit.lineage import lineage_of
from ..errors import describe_error
from ..store import LEASE_CHANNEL, CandidateRow

log = logging.getLogger("reef.grow")

#: candidate statuses a step leaves behind only while it runs (or when its process died)
UNSETTLED = ("proposed", "evaluating", "selected")
#: how often ``Leases.hold`` tries again while it may wait for a lease
ACQUIRE_RETRY_S = 0.1
#: seconds between tries of a ``LeaseListener`` whose database went away
LISTEN_RETRY_S = 2.0
INTERRUPTED_REASON = ("interrupted: the growth step that made this candidate stopped before publishing it "
                      "(its server stopped or lost the scenario's growth lease); its experience returns to "
                      "the pool under the return rule")


def host_id() -> str:
    """This host as lease holders name it: the host name and, where it can be read, the PID
    namespace (two containers may share a host name but never a PID namespace)."""
    name = socket.gethostname().replace(":", "_")
    try:
        return f"{name}#{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return name


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs on this host (a zombie counts as dead: it can do nothing more)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def holder_is_dead(holder: str, host: str) -> bool:
    """Whether the lease holder ``holder`` (``host:pid:uuid``) is provably a dead process of
    ``host`` (an earlier incarnation of a server here, a killed worker); False when unsure."""
    try:
        their_host, pid, _ = holder.rsplit(":", 2)
        return their_host == host and int(pid) != os.getpid() and not process_alive(int(pid))
    except ValueError:
        return False


@dataclass
class Holding:
    """A held lease: the step's fencing credentials."""

    scenario: str
    holder: str
    token: int
    lost: bool = False
    #: when the statement that set the current expiry started (``time.monotonic``): the
    #: acquisition, then each renewal, which extend the expiry from that moment
    renewed_at: float = field(default_factory=time.monotonic)


class Leases:
    """The growth leases of one process (one instance per kernel)."""

    def __init__(self, store: Any, ttl_s: float):
        self.store = store
        self.ttl_s = float(ttl_s)
        self.host = host_id()
        self.holder = f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:12]}"

    def acquire(self, scenario: str) -> Holding | None:
        """Take ``scenario``'s lease (blocking): the holding, or None while a live process has it."""
        started = time.monotonic()
        token = self.store.acquire_lease(scenario, self.holder, self.ttl_s)
        if token is None:
            current = self.store.get_lease(scenario)
            if current is None or current.holder == self.holder or not holder_is_dead(current.holder, self.host):
                return None
            token = self.store.acquire_lease(scenario, self.holder, self.ttl_s,
                                             take_from=(current.holder, current.token))
            if token is None:
                return None
            log.warning("%s: took the growth lease over from %s, a process of this host that is gone",
                        scenario, current.holder)
        return Holding(scenario, self.holder, token, renewed_at=started)

    def release(self, holding: Holding) -> None:
        self.store.release_lease(holding.scenario, holding.holder, holding.token)

    @asynccontextmanager
    async def hold(self, scenario: str, wait_s: float = 0.0) -> AsyncIterator[Holding | None]:
        """The scenario's lease for the block (None: another process holds it, also after
        trying for ``wait_s`` seconds), renewed in the background while the block runs,
        released when it ends."""
        holding = await asyncio.to_thread(self.acquire, scenario)
        deadline = time.monotonic() + wait_s
        while holding is None and time.monotonic() < deadline:
            await asyncio.sleep(ACQUIRE_RETRY_S)
            holding = await asyncio.to_thread(self.acquire, scenario)
        if holding is None:
            yield None
            return
        beat = asyncio.create_task(self._heartbeat(holding), name=f"reef-lease-{scenario}")
        try:
            yield holding
        finally:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
            try:
                await asyncio.to_thread(self.release, holding)
            except Exception:  # it expires by itself; the next holder's token is higher anyway
                log.warning("%s: releasing the growth lease failed; it expires in %.0f s", scenario, self.ttl_s,
                            exc_info=True)

    async def _heartbeat(self, holding: Holding) -> None:
        """Renew ``holding`` every third of the TTL, counted from ``holding.renewed_at``.

        A renewal extends the expiry from the moment it starts, so the next one is due a third
        of the TTL after that start, not after it returned: a renewal slowed by its database
        (a commit waiting behind a large fsync, say) then still leaves the next one two thirds
        of the TTL to start in, instead of losing the lease to the time the slow one took."""
        while not holding.lost:
            await asyncio.sleep(max(0.0, holding.renewed_at + self.ttl_s / 3 - time.monotonic()))
            started = time.monotonic()
            late = started - holding.renewed_at
            try:
                renewed = await asyncio.to_thread(self.store.renew_lease, holding.scenario, holding.holder,
                                                  holding.token, self.ttl_s)
            except asyncio.CancelledError:
                raise
            except Exception:  # a database hiccup: the next beat tries again before the expiry
                log.warning("%s: renewing the growth lease failed", holding.scenario, exc_info=True)
                await asyncio.sleep(min(1.0, self.ttl_s / 10))
                continue
            if not renewed:
                holding.lost = True
                log.warning("%s: the growth lease (token %d) was lost; this step cannot publish%s",
                            holding.scenario, holding.token, late_renewal(late, self.ttl_s))
                continue
            took = time.monotonic() - started
            holding.renewed_at = started
            if late > self.ttl_s * 2 / 3 or took > self.ttl_s / 3:
                log.warning("%s: renewing the growth lease started %.1f s after the last renewal and took %.1f s "
                            "(loop.lease_ttl_s %.0f s): the process or its database is slow, and a renewal that "
                            "starts more than the TTL after the last one loses the lease", holding.scenario, late,
                            took, self.ttl_s)


def late_renewal(since: float, ttl_s: float) -> str:
    """Why a held lease expired, when the heartbeat came too late to renew it."""
    if since < ttl_s:
        return ""  # taken or released by someone else, not expired under us
    return (f" (its last renewal was {since:.1f} s earlier, past loop.lease_ttl_s {ttl_s:.0f} s: this process did "
            "not get to renew it in time, e.g. its event loop or threads were blocked or the machine overloaded)")


def settle_orphans(store: Any, rows: Iterable[CandidateRow], max_attempts: int) -> list[str]:
    """Settle unsettled candidates whose step can never finish (the caller proved it: it holds
    their scenario's lease with a newer token) once the chain was caught up
    (``settle_ended_steps``). Published ones (recorded, but their process died before marking
    them) are marked so; the others become errors and their experience returns to the pool
    under the return rule (not a learner lineage's snapshot's: the lineage trained on it). The ids settled as interrupted."""
    rows = list(rows)
    published = store.releases_of_candidates(row.id for row in rows)
    interrupted = []
    for row in rows:
        if row.id in published:
            store.update_candidate(row.id, status="published", release_id=published[row.id])
            continue
        # a snapshot of a learner lineage: the lineage trained on the batch already, for good
        trained = lineage_of((row.artifact or {}).get("metadata")) is not None
        store.update_candidate(row.id, status="error", decision=row.decision or "error", reason=INTERRUPTED_REASON,
                               return_experience=None if trained else max_attempts)
        interrupted.append(row.id)
    return interrupted


def settle_ended_steps(chain: Any, store: Any, scenario: str, token: int,
                       max_attempts: int) -> tuple[list[CandidateRow], list[str]]:
    """Settle the unsettled candidates of ``scenario`` left by holdings older than ``token`` (the
    caller holds the lease with it): (the candidates settled, the ids settled as interrupted).

    The chain first (``ReleaseChain.catch_up``): a step killed after its release reached the
    artifact store but before the database row leaves a ``selected`` candidate whose release
    only the store knows. Settled before that release is recorded, it would count as
    interrupted and its experience, which serves already, would return to the pool and train
    again. Raises (settling nothing) when the chain cannot be read."""
    chain.catch_up(scenario)
    orphans = orphans_of(store, scenario, token)
    return orphans, settle_orphans(store, orphans, max_attempts)


def orphans_of(store: Any, scenario: str, token: int) -> list[CandidateRow]:
    """Undecided candidates of ``scenario`` from holdings older than ``token``."""
    return [row for row in store.candidates_with_status(UNSETTLED)
            if row.scenario == scenario and (row.lease_token is None or row.lease_token < token)]


class LeaseListener:
    """Hears PostgreSQL ``NOTIFY``s of released leases and calls ``on_release(scenario)`` (from
    its own thread). Reconnects after an error; the schedule and polling cover the gap."""

    def __init__(self, url: str, on_release: Callable[[str], None]):
        self.url = url
        self.on_release = on_release
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reef-lease-listener", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        import psycopg
        from sqlalchemy.engine import make_url

        dsn = make_url(self.url).set(drivername="postgresql").render_as_string(hide_password=False)
        down = False  # while the database is away: one line when it goes, one when it is back
        while not self._stop.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {LEASE_CHANNEL}")
                    if down:
                        log.warning("listening for growth lease releases again")
                        down = False
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            self.on_release(note.payload)
            except Exception as exc:  # the database went away: listen again shortly
                if not down:
                    log.warning("listening for growth lease releases failed (%s); retrying every %.0f s "
                                "(growth triggers fall back to loop.lease_poll_s meanwhile)",
                                describe_error(exc), LISTEN_RETRY_S)
                    down = True
                self._stop.wait(LISTEN_RETRY_S)
