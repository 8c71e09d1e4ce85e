"""A cross-process ``flock`` next to a SQLite file, shared by every Reef process using it.

It orders Reef's own processes at the two moments where SQLite's busy handler serves them
badly: opening a store (the first connection switches the file to WAL and runs migrations;
SQLite answers some of those lock conflicts with an immediate ``database is locked`` instead
of waiting) and committing records from several workers (a writer that finds the write lock
taken sleeps 1, 2, 5, 10... ms between retries however soon the lock is released; a waiter
on the flock is woken the moment the holder is done).
"""

from __future__ import annotations

import logging
import os

from sqlalchemy.engine import make_url

log = logging.getLogger("reef.store")


class FileLock:
    """An exclusive ``flock`` on ``path`` (created if missing), held for a ``with`` block.

    Blocking in ``flock`` costs no polling. The lock is advisory: it only orders Reef's
    processes among themselves; SQLite's own locking still guards the file against others.
    """

    def __init__(self, path: str):
        import fcntl

        self._fcntl = fcntl
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def __enter__(self) -> FileLock:
        self._fcntl.flock(self._fd, self._fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        self._fcntl.flock(self._fd, self._fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


def sqlite_file(url: str) -> str | None:
    """The database file of a SQLite ``url``; None for other databases, in-memory SQLite and
    ``file:`` URIs."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:" \
            or u.database.startswith("file:"):
        return None
    return u.database


def lock_for(url: str) -> FileLock | None:
    """The cross-process lock of ``url``'s SQLite file (``<file>.commit-lock``); None for other
    databases or where ``flock`` does not exist or the lock file cannot be created (SQLite's
    busy handler then orders the processes, as it would anyway)."""
    path = sqlite_file(url)
    if path is None:
        return None
    try:
        return FileLock(f"{os.path.expanduser(path)}.commit-lock")
    except (ImportError, OSError) as exc:
        log.warning("no cross-process lock for %s (%s); SQLite's busy handler orders writers", path, exc)
        return None
