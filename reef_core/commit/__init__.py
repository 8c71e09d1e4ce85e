"""Commit: evaluate a candidate fail-closed, publish winners to the release chain by
compare-and-swap, and serve the head release (harness injection, materialized artifacts)."""

from .artifacts import (
    MANIFEST,
    ArtifactError,
    StoredRelease,
    content_hash,
    file_checksums,
)
from .chain import ChainInconsistent, ReleaseChain
from .gate import EvalContext, run_gate
from .harness import Harness, HarnessCache, inject, read_harness

__all__ = [
    "MANIFEST",
    "ArtifactError",
    "ChainInconsistent",
    "EvalContext",
    "Harness",
    "HarnessCache",
    "ReleaseChain",
    "StoredRelease",
    "content_hash",
    "file_checksums",
    "inject",
    "read_harness",
    "run_gate",
]
