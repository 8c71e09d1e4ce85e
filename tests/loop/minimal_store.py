"""An artifact store written from the contract alone: exactly ``ArtifactStore``'s abstract
methods, keeping releases in plain directories (no git)."""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from reef_core import ArtifactStore, PublishConflict, StoredRelease
from reef_core.commit.artifacts import MANIFEST, copy_artifact


class DirectoryStore(ArtifactStore):
    """``<state_dir>/dir-store/<scenario>/<commit>/`` per release; ``log.json`` lists the commits, newest first."""

    _lock = threading.Lock()

    def __init__(self, state_dir: Path):
        self.root = Path(state_dir) / "dir-store"
        self.root.mkdir(parents=True, exist_ok=True)

    def _dir(self, scenario: str) -> Path:
        return self.root / quote(scenario, safe="")

    def _log(self, scenario: str) -> list[str]:
        path = self._dir(scenario) / "log.json"
        return json.loads(path.read_text()) if path.is_file() else []

    def _head_commit(self, scenario: str) -> str | None:
        log = self._log(scenario)
        return log[0] if log else None

    def _stored(self, scenario: str, commit: str) -> StoredRelease:
        return StoredRelease(commit, json.loads((self._dir(scenario) / commit / MANIFEST).read_text()))

    def scenarios(self) -> list[str]:
        return sorted(unquote(d.name) for d in self.root.iterdir() if (d / "log.json").is_file())

    def head(self, scenario: str) -> StoredRelease | None:
        commit = self._head_commit(scenario)
        return self._stored(scenario, commit) if commit else None

    def history(self, scenario: str) -> list[StoredRelease]:
        return [self._stored(scenario, c) for c in self._log(scenario)]

    def publish(self, scenario: str, artifact_dir: Path, manifest: dict[str, Any], *,
                expected_head: str | None) -> StoredRelease:
        with self._lock:
            if self._head_commit(scenario) != expected_head:
                raise PublishConflict(f"{scenario!r} moved past {expected_head}")
            commit = uuid.uuid4().hex
            dest = copy_artifact(Path(artifact_dir), self._dir(scenario) / commit)
            (dest / MANIFEST).write_text(json.dumps(manifest))
            tmp = self._dir(scenario) / "log.json.tmp"
            tmp.write_text(json.dumps([commit, *self._log(scenario)]))
            tmp.replace(self._dir(scenario) / "log.json")
            return StoredRelease(commit, manifest)

    def materialize(self, scenario: str, commit: str, dest: Path) -> Path:
        shutil.copytree(self._dir(scenario) / commit, dest, ignore=shutil.ignore_patterns(MANIFEST))
        return Path(dest)
