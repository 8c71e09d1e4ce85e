"""The search archive on disk, committed only once the server serves what its step trained.

Two files in the run directory: ``archive.json`` (the last committed step) and
``archive.pending.json`` (a step whose grid was reported but whose release is not serving
yet). Both carry the run's identity — task, instruction hash, model, grid, sampling, PUCT c,
invalid reward — and a run refuses to resume from files of another identity. Writes are atomic
(a temporary file renamed over the old one).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .archive import PUCTArchive

FORMAT = "reef-tttd-archive/1"
COMMITTED = "archive.json"
PENDING = "archive.pending.json"


class IdentityMismatch(RuntimeError):
    """The run directory holds an archive of another search."""


def instruction_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


class RunDirectory:
    """Where one search keeps its archive."""

    def __init__(self, path: str | Path, identity: dict[str, Any]):
        self.path = Path(path)
        self.identity = identity

    def _read(self, name: str) -> dict[str, Any] | None:
        file = self.path / name
        if not file.is_file():
            return None
        data = json.loads(file.read_text())
        if data.get("format") != FORMAT:
            raise IdentityMismatch(f"{file} is not a TTT-Discover archive ({FORMAT}); use another run directory")
        if data.get("identity") != self.identity:
            diff = sorted(k for k in set(data.get("identity", {})) | set(self.identity)
                          if data.get("identity", {}).get(k) != self.identity.get(k))
            raise IdentityMismatch(f"{file} belongs to another search (it differs in {', '.join(diff)}); "
                                   "resume with the same settings or start a new run directory")
        return data

    def committed(self) -> dict[str, Any] | None:
        """The last committed state: ``{"step", "archive", "history", ...}`` or None for a new run."""
        return self._read(COMMITTED)

    def pending(self) -> dict[str, Any] | None:
        return self._read(PENDING)

    def write_pending(self, step: int, archive: PUCTArchive, history: list[dict[str, Any]],
                      wait: dict[str, Any], *, run: str = "") -> None:
        _write(self.path / PENDING, {"format": FORMAT, "identity": self.identity, "status": "pending", "step": step,
                                     "run": run,
                                     "archive": archive.to_json(), "history": history, "wait": wait})

    def commit(self, release_id: str | None) -> dict[str, Any]:
        """Promote the pending step to committed (the server serves its release)."""
        data = self.pending()
        if data is None:
            raise RuntimeError("no pending step to commit")
        data.update(status="committed", committed_release=release_id)
        data.pop("wait", None)
        _write(self.path / COMMITTED, data)
        (self.path / PENDING).unlink()
        return data
