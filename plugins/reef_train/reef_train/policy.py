"""The trainable policy: a separate LoRA copy of the served base, and its saved adapter.

Why a separate model copy rather than training the serving object under a lock: a
gradient step mutates LoRA weights in place, and the serving engine batches requests of
many scenarios through one PeftModel on its own thread. Sharing it would mean either
pausing all serving for the whole training run or risking a forward that reads
half-updated weights. The copy costs one more set of base weights in memory (0.5 GB for
SmolLM2 in fp32, reloaded from the cached directory in well under a second) and keeps
serving and learning fully independent: training produces an adapter directory, and only
the Commit step's ``runtime.activate`` brings it into serving.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy (when present) and torch for a reproducible training run."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:
        pass


def linear_module_names(model: Any, include_lm_head: bool = False) -> list[str]:
    """Suffixes of the model's ``nn.Linear`` layers, the usual LoRA targets.

    Add ``lm_head`` for tiny randomly initialised models: without it LoRA cannot sharpen
    their near-uniform logits (e.g. ``reef_train.testing.build_tiny_model``'s)."""
    names = set()
    for full, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            names.add(full.rsplit(".", 1)[-1])
    if not include_lm_head:
        names.discard("lm_head")
    else:
        names.add("lm_head")
    return sorted(names)


def load_policy(
    model_dir: str | Path,
    adapter_dir: str | Path | None = None,
    *,
    r: int = 16,
    alpha: int = 32,
    target_modules: Sequence[str] | str | None = None,
    include_lm_head: bool = False,
    device: str = "cpu",
    dtype: Any = torch.float32,
    seed: int | None = None,
) -> Any:
    """A trainable PeftModel on a fresh copy of the base in ``model_dir``.

    With ``adapter_dir`` (e.g. the serving release's ``adapter/``) training continues from
    that adapter; otherwise a new LoRA (``r``, ``alpha``, ``target_modules`` — default every
    linear layer) starts at zero, i.e. exactly the base model's behaviour.
    """
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    if seed is not None:
        seed_everything(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, local_files_only=True).to(device)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)
    else:
        targets = list(target_modules) if isinstance(target_modules, (list, tuple)) else target_modules
        config = LoraConfig(
            r=r,
            lora_alpha=alpha,
            lora_dropout=0.0,
            target_modules=targets or linear_module_names(base, include_lm_head),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, config)
    model.train()
    return model


def load_trainable(base: Any, adapter_dir: str | Path | None = None, **options: Any) -> Any:
    """``load_policy`` for a served base: a trainable copy of it, on its device.

    ``base`` describes the base the runtime serves: an object with ``path`` (the local model
    directory) and optionally ``device`` — what ``reef_core.TrainableBase.base_model()`` returns
    (``reef_core.ServedBase``; this library does not import reef-core) — or a model directory.
    ``adapter_dir`` is the LoRA to continue from (``runtime.adapter_of(current)``; None: a fresh
    one). ``options`` go to ``load_policy`` (``r``, ``alpha``, ``seed``, ``dtype`` …; ``device``
    overrides the base's). Training loads float32 unless ``dtype`` says otherwise.
    """
    path, device = _base_path_and_device(base)
    if "device" not in options and device is not None:
        options["device"] = _resolve_device(device)
    return load_policy(path, adapter_dir, **options)


def load_tokenizer(base: Any) -> Any:
    """The tokenizer of ``base`` (as for ``load_trainable``), loaded offline from its directory."""
    from transformers import AutoTokenizer

    path, _ = _base_path_and_device(base)
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _resolve_device(device: str | None) -> str:
    """``auto`` (or empty) → ``cuda`` when available, else ``cpu``; anything else as given."""
    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)


def _base_path_and_device(base: Any) -> tuple[Path, str | None]:
    if isinstance(base, (str, os.PathLike)):
        return Path(base), None
    path = getattr(base, "path", None)
    if path is None:
        raise TypeError(f"expected a model directory or a served base with a `path` (reef_core.ServedBase), "
                        f"not {type(base).__name__}")
    return Path(path), getattr(base, "device", None)


def save_adapter(model: Any, artifact_dir: str | Path) -> Path:
    """Write the LoRA adapter as ``<artifact_dir>/adapter/`` (a PEFT directory) and return it.

    ``save_embedding_layers=False`` keeps a targeted ``lm_head``'s full base weight out of the
    file, which would otherwise break hot-loading next to other adapters."""
    out = Path(artifact_dir) / "adapter"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), save_embedding_layers=False)
    return out
