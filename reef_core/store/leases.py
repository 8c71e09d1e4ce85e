"""Growth leases: which process may run a growth step of a scenario, across every process that
shares the store (``reef serve`` processes on one host or many, ``server.workers``).

A lease is a ``growth_leases`` row per scenario. Acquiring it is one conditional upsert: the
row is taken when it is free (``expires_at`` passed, or released) and its ``token`` grows by
one, the fencing token of that holding. A holder renews it while its step runs; it may renew
only while the lease is still its own and unexpired, so a lease once lost stays lost.

Times are the database's clock (seconds since the epoch), never a server's: processes on
several hosts compare expiries against one clock.

``fenced`` is the publish check: inside it, the lease row is locked (``SELECT ... FOR UPDATE``
on PostgreSQL; SQLite's writer lock, ``BEGIN IMMEDIATE``) and known to be held with the
caller's token, and no process can acquire it until the block ends. The artifact store's
compare-and-swap runs inside it, so a holder that lost its lease (paused past its expiry,
partitioned) cannot publish after another one took over.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import literal_column, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import OperationalError

from ..errors import ConflictError
from .models import GrowthLease, storable

log = logging.getLogger("reef.store")

#: PostgreSQL ``NOTIFY`` channel: the payload is a scenario whose lease was just released
LEASE_CHANNEL = "reef_grow"
#: on PostgreSQL, how long acquiring waits for a lease row another process has locked
#: (it is publishing); longer, and the acquisition answers "held"
ACQUIRE_LOCK_TIMEOUT_MS = 2000

_T = GrowthLease.__table__


class LeaseLost(ConflictError):
    """The caller no longer holds the growth lease with the token it presented."""


def _now(dialect: str) -> Any:
    """The database's clock in seconds since the epoch, as a SQL expression."""
    if dialect == "postgresql":
        return literal_column("CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)")
    return literal_column("((julianday('now') - 2440587.5) * 86400.0)")


class LeaseStore:
    """Lease methods of ``RecordStore`` (each one transaction on the writer engine)."""

    _writer: Any
    _reader: Any

    def acquire_lease(self, scenario: str, holder: str, ttl_s: float, *,
                      take_from: tuple[str, int] | None = None) -> int | None:
        """Take ``scenario``'s lease for ``ttl_s`` seconds: the new fencing token, or None
        while another holder has it. ``take_from=(holder, token)`` also takes it from that
        holding before it expires (the caller proved that holder's process is dead)."""
        if not storable(scenario):
            return None
        dialect = self._writer.dialect.name
        now = _now(dialect)
        ins = (pg_insert if dialect == "postgresql" else sqlite_insert)(_T)
        free = _T.c.expires_at <= now
        if take_from is not None:
            free = free | ((_T.c.holder == take_from[0]) & (_T.c.token == take_from[1]))
        stmt = (ins.values(scenario=scenario, holder=holder, token=1, expires_at=now + ttl_s,
                           heartbeat_at=now, acquired_at=now)
                .on_conflict_do_update(index_elements=[_T.c.scenario], where=free,
                                       set_={"holder": holder, "token": _T.c.token + 1,
                                             "expires_at": now + ttl_s, "heartbeat_at": now,
                                             "acquired_at": now})
                .returning(_T.c.token))
        try:
            with self._writer.begin() as conn:
                if dialect == "postgresql":
                    conn.exec_driver_sql(f"SET LOCAL lock_timeout = {ACQUIRE_LOCK_TIMEOUT_MS}")
                return conn.execute(stmt).scalar()
        except OperationalError as exc:
            if dialect == "postgresql" and "lock timeout" in str(exc).lower():
                return None  # the holder is publishing under the row lock: held
            raise

    def renew_lease(self, scenario: str, holder: str, token: int, ttl_s: float) -> bool:
        """Extend a holding by ``ttl_s`` seconds from now; False when it is not the caller's
        anymore (expired, released, or taken by another holder)."""
        now = _now(self._writer.dialect.name)
        stmt = (update(_T).where(_T.c.scenario == scenario, _T.c.holder == holder, _T.c.token == token,
                                 _T.c.expires_at > now)
                .values(expires_at=now + ttl_s, heartbeat_at=now))
        with self._writer.begin() as conn:
            return conn.execute(stmt).rowcount == 1

    def release_lease(self, scenario: str, holder: str, token: int) -> bool:
        """End a holding now (the token stays, so the next holder's is higher); on PostgreSQL
        every listening process hears of it (``LEASE_CHANNEL``). False when it was not held."""
        dialect = self._writer.dialect.name
        now = _now(dialect)
        stmt = (update(_T).where(_T.c.scenario == scenario, _T.c.holder == holder, _T.c.token == token,
                                 _T.c.expires_at > now)
                .values(expires_at=now))
        with self._writer.begin() as conn:
            released = conn.execute(stmt).rowcount == 1
            if dialect == "postgresql":
                conn.execute(text("SELECT pg_notify(:channel, :scenario)"),
                             {"channel": LEASE_CHANNEL, "scenario": scenario})
        return released

    def get_lease(self, scenario: str) -> GrowthLease | None:
        if not storable(scenario):
            return None
        with self._reader.connect() as conn:
            row = conn.execute(select(_T).where(_T.c.scenario == scenario)).mappings().first()
        return GrowthLease(**row) if row else None

    def lease_clock(self) -> float:
        """The database's clock (what lease expiries are compared with)."""
        with self._reader.connect() as conn:
            return float(conn.execute(select(_now(self._reader.dialect.name))).scalar())

    @contextmanager
    def fenced(self, scenario: str, holder: str, token: int) -> Iterator[None]:
        """Run the block while ``scenario``'s lease is provably held by ``holder`` with
        ``token`` and cannot change hands; LeaseLost (before the block runs) when it is not."""
        dialect = self._writer.dialect.name
        q = select(_T.c.holder, _T.c.token, (_T.c.expires_at > _now(dialect)).label("live")).where(
            _T.c.scenario == scenario)
        if dialect == "postgresql":
            q = q.with_for_update()
        with self._writer.begin() as conn:
            row = conn.execute(q).first()
            if row is None or row.holder != holder or row.token != token or not row.live:
                now_held = "nobody" if row is None else f"{row.holder} (token {row.token}" + (
                    ")" if row.live else ", expired)")
                raise LeaseLost(f"the growth lease of scenario {scenario!r} is no longer held with token {token} "
                                f"(now: {now_held}); this step may not publish")
            yield
