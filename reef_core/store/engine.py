"""Database engines: SQLite in WAL mode with durable commits, or PostgreSQL by URL."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url


def normalize_url(url: str) -> str:
    """Accept ``postgres://`` / ``postgresql://`` and pick the psycopg 3 driver."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


def make_engines(url: str, *, synchronous: str = "full") -> tuple[Engine, Engine]:
    """(writer, reader) engines for ``url``.

    SQLite writers open transactions with ``BEGIN IMMEDIATE`` so concurrent writers (threads
    or processes) queue on the busy timeout instead of failing on a read-to-write lock
    upgrade; readers keep deferred transactions and never block writers under WAL.
    ``synchronous=FULL`` (the default) makes every commit durable across power loss, not only
    crashes; ``normal`` keeps crash safety under WAL and saves one fsync per commit.
    """
    if synchronous not in ("full", "normal"):
        raise ValueError(f"synchronous must be 'full' or 'normal', not {synchronous!r}")
    url = normalize_url(url)
    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        engine = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
        return engine, engine
    if u.database and u.database != ":memory:":
        Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    writer = _sqlite_engine(url, immediate=True, synchronous=synchronous)
    reader = _sqlite_engine(url, immediate=False, synchronous=synchronous)
    return writer, reader


def _sqlite_engine(url: str, *, immediate: bool, synchronous: str) -> Engine:
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": 60, "isolation_level": None},
        pool_size=8,
        max_overflow=16,
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record):  # noqa: ANN001
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):  # noqa: ANN001
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine
