"""Database engines: SQLite in WAL mode with durable commits, or PostgreSQL by URL."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import OperationalError

from ..errors import StoreError
from .filelock import lock_for

try:  # pragma: no cover - which branch runs depends on the environment
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

log = logging.getLogger("reef.store")

#: how long opening a SQLite store keeps retrying ``database is locked`` before giving up
OPEN_RETRY_S = 30.0


def normalize_url(url: str) -> str:
    """Accept ``postgres://`` / ``postgresql://`` and pick the psycopg 3 driver."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


#: the extra of reef-core that installs a database's driver (``pip install 'reef-core[postgres]'``)
DRIVER_EXTRAS = {"psycopg": "postgres"}


class MissingDriver(StoreError):
    """The database's driver is not installed; ``install`` says how to install it."""

    def __init__(self, module: str):
        extra = DRIVER_EXTRAS.get(module)
        self.install = f"pip install 'reef-core[{extra}]'" if extra else f"pip install {module}"
        super().__init__(f"the database driver {module!r} is not installed: {self.install}")


def create_engine_for(url: str, **kwargs: object) -> Engine:
    """``create_engine`` for a normalized ``url``; a driver that is not installed is a
    ``MissingDriver`` naming the extra that installs it (SQLAlchemy says only "No module named
    'psycopg'")."""
    try:
        return create_engine(url, **kwargs)
    except ModuleNotFoundError as exc:
        raise MissingDriver((exc.name or "").split(".")[0] or str(exc)) from None


def json_serializer(value: object) -> str:
    """JSON text for the store's JSON columns: orjson, about 5x the standard library's speed
    (these columns hold every record's request and response, encoded inside the writer's
    transaction); the standard library for what orjson refuses (integers beyond 64 bits,
    types it does not know). orjson writes NaN and infinities as null: JSON has no such
    values and PostgreSQL's jsonb refuses them (the standard library wrote a non-JSON literal
    that only SQLite kept)."""
    if orjson is not None:
        try:
            return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:
            pass
    return json.dumps(value)


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
        engine = create_engine_for(url, pool_pre_ping=True, pool_size=10, max_overflow=20,
                                   json_serializer=json_serializer)
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
        json_serializer=json_serializer,
        pool_size=8,
        max_overflow=16,
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record):  # noqa: ANN001
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):  # noqa: ANN001
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def open_store(writer: Engine, *, migrate: bool) -> None:
    """Prepare the database behind ``writer`` for use: on SQLite, switch the file to WAL (a
    persistent setting, made once here rather than on every new connection); then run pending
    migrations when ``migrate``.

    On a SQLite file, Reef's processes do this one at a time under the file's cross-process
    lock (several ``server.workers`` start together, and a replacement worker starts while the
    others commit), and a ``database is locked`` that SQLite returns without waiting in its busy
    handler (it does so where waiting could deadlock, or while another connection recovers the
    WAL index) is retried for up to :data:`OPEN_RETRY_S` seconds.
    """
    sqlite = writer.dialect.name == "sqlite"
    lock = lock_for(writer.url.render_as_string(hide_password=False)) if sqlite else None
    deadline = time.monotonic() + OPEN_RETRY_S
    delay = 0.05
    try:
        while True:
            try:
                with lock if lock is not None else contextlib.nullcontext():
                    if sqlite:
                        raw = writer.raw_connection()  # outside SQLAlchemy's transaction: the switch refuses one
                        try:
                            raw.driver_connection.execute("PRAGMA journal_mode=WAL")
                        finally:
                            raw.close()
                    if migrate:
                        from .migrate import upgrade

                        upgrade(writer)
                return
            except OperationalError as exc:
                if not sqlite or "locked" not in str(exc.orig) or time.monotonic() + delay > deadline:
                    raise
                log.warning("the record store is locked while opening; retrying in %.2fs", delay)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
    finally:
        if lock is not None:
            lock.close()

