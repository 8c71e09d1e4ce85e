"""Artifact directories: the files a release holds, their checksums and content hash.

An artifact is a directory with ``harness/`` (``system.md``, ``rules.md``,
``skills/<name>/SKILL.md``, ``config.json``) and/or ``adapter/`` (a PEFT LoRA directory).
Its content hash is deterministic: SHA-256 over the sorted (path, size, SHA-256) of every
file, so the same tree always hashes the same, wherever and whenever it is published.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ReefError

#: the manifest every release commit carries at its root (never part of the content hash)
MANIFEST = "reef-release.json"
MANIFEST_FORMAT = "reef-release/1"

_SEGMENT = re.compile(r"^[A-Za-z0-9_+@-][A-Za-z0-9._+@-]*$")


class ArtifactError(ReefError):
    """An artifact directory cannot be published or read (unsafe path, link, missing store)."""


def check_path(rel: str) -> str:
    """``rel`` if it is a safe relative POSIX path (no ``..``, no dot-leading or odd characters)."""
    parts = rel.split("/")
    if not rel or any(not _SEGMENT.match(p) for p in parts):
        raise ArtifactError(f"artifact file name {rel!r} is not allowed: use letters, digits and "
                            "'._+@-' in each path part, not starting with a dot")
    return rel


def artifact_files(root: Path) -> list[tuple[str, Path]]:
    """Every file of the artifact at ``root`` as sorted (relative POSIX path, absolute path)."""
    root = Path(root)
    if not root.is_dir():
        raise ArtifactError(f"artifact directory {str(root)!r} does not exist")
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if rel == MANIFEST:
            continue
        if p.is_symlink():
            raise ArtifactError(f"artifact file {rel!r} is a symbolic link; artifacts hold plain files only")
        if p.is_file():
            out.append((check_path(rel), p))
    return sorted(out)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def describe(root: Path) -> tuple[str, dict[str, str]]:
    """(content hash, {relative path: SHA-256}) of the artifact at ``root``, reading each file once.

    The content hash is SHA-256 over the sorted ``path NUL size NUL sha256`` lines of every
    file (manifest excluded): the same tree always hashes the same.
    """
    h = hashlib.sha256()
    sums = {}
    for rel, p in artifact_files(root):
        sums[rel] = sha256_file(p)
        h.update(f"{rel}\0{p.stat().st_size}\0{sums[rel]}\n".encode())
    return h.hexdigest(), sums


def file_checksums(root: Path) -> dict[str, str]:
    """{relative path: SHA-256} of every artifact file under ``root``."""
    return describe(root)[1]


def content_hash(root: Path) -> str:
    """The deterministic hash of the artifact tree at ``root`` (manifest excluded)."""
    return describe(root)[0]


def copy_artifact(src: Path, dest: Path) -> Path:
    """Copy the artifact files of ``src`` into a new directory ``dest`` (manifest excluded)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=False)
    for rel, p in artifact_files(src):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, target)
    return dest


@dataclass(frozen=True)
class StoredRelease:
    """One release as the artifact store holds it: the commit and its manifest."""

    commit: str
    manifest: dict[str, Any]

    @property
    def release_id(self) -> str:
        """The manifest's ``release_id``; "" when it is no string (a release ``release_checks``
        refuses, still listed in its chain's history)."""
        value = self.manifest.get("release_id")
        return value if isinstance(value, str) else ""

    @property
    def scenario(self) -> str:
        return self.manifest["scenario"]

    @property
    def sequence(self) -> int:
        return int(self.manifest["sequence"])

    @property
    def parent_id(self) -> str | None:
        return self.manifest.get("parent")

    @property
    def content_hash(self) -> str:
        return self.manifest["content_hash"]

    @property
    def operation(self) -> str:
        return self.manifest.get("operation", "train")

    @property
    def candidate_id(self) -> str | None:
        return self.manifest.get("candidate_id")
