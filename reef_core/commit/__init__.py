"""Commit: evaluate a candidate fail-closed, publish winners to the release chain by
compare-and-swap, and serve the head release (harness injection, materialized artifacts)."""

from ..kit.lazy import lazy_exports

# Loaded on first use: the chain imports the store (SQLAlchemy), which a module that only needs
# ``commit.harness`` or ``commit.artifacts`` (a harness adapter, the CLI) must not pay for.
__getattr__ = lazy_exports(__name__, {
    ".artifacts": ("MANIFEST", "ArtifactError", "StoredRelease", "content_hash", "file_checksums"),
    ".chain": ("ChainInconsistent", "ReleaseChain"),
    ".gate": ("EvalContext", "run_gate"),
    ".harness": ("Harness", "HarnessCache", "inject", "read_harness"),
})

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
