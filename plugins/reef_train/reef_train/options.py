"""``LoraOptions``: the trainable LoRA policy and its optimizer, as every weight recipe configures it.

The field names are the recipes' option names (``recipe.lora_rank=8``), so a problem is named
the way the user wrote it. Building the options checks every field at once and raises one
``ValueError`` naming each problem; a recipe adds that sentence to its own configuration
problems (the kernel turns it into one line, exit 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

OPTIMIZERS = ("adamw", "adam")


@dataclass(frozen=True)
class LoraOptions:
    """A new LoRA's shape, its optimizer, gradient clipping, where it trains and its seed.

    A policy continued from a published adapter keeps that adapter's own shape; ``lora_rank``,
    ``lora_alpha`` and ``lora_lm_head`` shape a new one (and a new critic)."""

    lr: float = 1e-4
    lora_rank: int = 16
    lora_alpha: int = 32
    #: also adapt the output layer (tiny random models need it to sharpen their logits)
    lora_lm_head: bool = False
    #: clip the gradient norm to this before each optimizer step; None: no clipping
    max_grad_norm: float | None = 1.0
    #: ``adamw`` (decoupled weight decay) or ``adam`` (L2 weight decay, TTT-Discover's)
    optimizer: str = "adamw"
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    #: ``auto``: the served base's device (cuda when available); or ``cpu``, ``cuda:1``, ``mps``
    device: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        values: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            try:
                values[f.name] = _coerce(f.name, value)
            except (TypeError, ValueError):
                problems.append(f"{f.name} must be {_KIND[f.name]}, not {value!r}")
        problems += _range_problems(values)
        if problems:
            raise ValueError("; ".join(problems))
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_options(cls, options: Mapping[str, Any], **fixed: Any) -> LoraOptions:
        """The LoRA options among a recipe's options (the same names), with the values a recipe
        fixes (``optimizer="adam"``) over them; ``ValueError`` naming every problem."""
        names = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in options.items() if k in names}, **fixed})

    def lora(self) -> dict[str, Any]:
        """Keyword arguments of ``reef_train.load_trainable`` for a policy with these options."""
        out: dict[str, Any] = {"r": self.lora_rank, "alpha": self.lora_alpha, "seed": self.seed,
                               "include_lm_head": self.lora_lm_head}
        if self.device != "auto":
            out["device"] = self.device
        return out


def learner_option_problems(options: Mapping[str, Any], **fixed: Any) -> list[str]:
    """The problems of a weight recipe's learner options: its LoRA and optimizer
    (``LoraOptions.from_options(options, **fixed)``) and its ``trainer`` (``make_trainer``),
    one sentence each, for the recipe's ``option_problems``."""
    from .backend import TrainerError, make_trainer

    problems = []
    try:
        LoraOptions.from_options(options, **fixed)
    except ValueError as exc:
        problems.append(str(exc))
    try:
        make_trainer(options.get("trainer"))
    except (ValueError, TrainerError) as exc:
        problems.append(str(exc))
    return problems


_KIND = {
    "lr": "a number above 0", "lora_rank": "an integer of 1 or more", "lora_alpha": "an integer of 1 or more",
    "lora_lm_head": "true or false", "max_grad_norm": "a number above 0, or null (no clipping)",
    "optimizer": f"one of {', '.join(OPTIMIZERS)}", "beta1": "a number in [0, 1)", "beta2": "a number in [0, 1)",
    "eps": "a number above 0", "weight_decay": "a number of 0 or more",
    "device": "auto or a torch device (cpu, cuda, cuda:1, mps)", "seed": "an integer",
}


def _coerce(name: str, value: Any) -> Any:
    if name == "lora_lm_head":
        if not isinstance(value, bool):
            raise TypeError(name)
        return value
    if name in ("lora_rank", "lora_alpha", "seed"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(name)
        return int(value)
    if name in ("optimizer", "device"):
        if not isinstance(value, str):
            raise TypeError(name)
        return value
    if name == "max_grad_norm" and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(name)
    return float(value)


def _range_problems(v: dict[str, Any]) -> list[str]:
    """The problems of the values that have the right type."""
    bad = []
    for name in ("lr", "eps"):
        if name in v and not (v[name] > 0 and math.isfinite(v[name])):
            bad.append(name)
    for name in ("lora_rank", "lora_alpha"):
        if name in v and v[name] < 1:
            bad.append(name)
    if v.get("max_grad_norm") is not None and not (v["max_grad_norm"] > 0 and math.isfinite(v["max_grad_norm"])):
        bad.append("max_grad_norm")
    for name in ("beta1", "beta2"):
        if name in v and not 0 <= v[name] < 1:
            bad.append(name)
    if "weight_decay" in v and not (v["weight_decay"] >= 0 and math.isfinite(v["weight_decay"])):
        bad.append("weight_decay")
    if "optimizer" in v and v["optimizer"] not in OPTIMIZERS:
        bad.append("optimizer")
    if "device" in v and not _is_device(v["device"]):
        bad.append("device")
    return [f"{name} must be {_KIND[name]}, not {v[name]!r}" for name in bad]


def _is_device(name: str) -> bool:
    if name == "auto":
        return True
    import torch

    try:
        torch.device(name)
    except (RuntimeError, ValueError):
        return False
    return True
