"""AdamW (or Adam) over the LoRA parameters only, and one backward/clip/step."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


def trainable_parameters(model: Any) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def make_optimizer(model: Any, lr: float = 1e-4, weight_decay: float = 0.0, *, kind: str = "adamw",
                   betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                   params: Sequence[torch.nn.Parameter] | None = None) -> torch.optim.Optimizer:
    """AdamW (``kind="adam"``: Adam, whose weight decay is an L2 term) over the LoRA parameters
    only; refuses a model whose base weights would train. ``params``: exactly these instead (a
    critic's LoRA and value head)."""
    if params is None:
        params = []
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            if "lora_" not in name:
                raise ValueError(f"Parameter {name} is trainable but not a LoRA weight; load the policy with load_policy().")
            params.append(p)
        if not params:
            raise ValueError("The model has no trainable LoRA parameters; load the adapter with is_trainable=True.")
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if kind != "adamw":
        raise ValueError(f"Unknown optimizer {kind!r}; use 'adamw' or 'adam'.")
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def optimizer_step(model: Any, optimizer: torch.optim.Optimizer, loss: torch.Tensor | None,
                   max_grad_norm: float | None = 1.0) -> float:
    """Back-propagate ``loss`` (None: the gradients are already accumulated), clip the gradient
    norm of ``model``'s trainable parameters (or of ``model``, a list of parameters) to
    ``max_grad_norm`` (None: no clipping), step, zero; returns the norm before clipping. A
    gradient that is not finite (inf or NaN, e.g. from a reward of 1e300) does not step: it
    would write NaN into every parameter and the optimizer's moments for good."""
    if loss is not None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
    params = list(model) if isinstance(model, (list, tuple)) else trainable_parameters(model)
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    else:
        grads = [p.grad.detach() for p in params if p.grad is not None]
        norm = torch.sqrt(sum((g ** 2).sum() for g in grads)) if grads else 0.0
    if math.isfinite(float(norm)):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
