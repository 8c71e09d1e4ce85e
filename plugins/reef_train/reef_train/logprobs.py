"""Log-probabilities under a policy, in the convention the runtime records: the one place a
weight recipe gets them from (``tests/test_recipe_logprobs.py`` fails on a recipe that writes
its own).

``scaled_log_softmax`` is the convention itself, ``log_softmax(logits / T)`` with ``T <= 0``
(greedy) taken as 1, one temperature for the batch or one per row; ``reef_train.sampling``
samples through it, so a freshly loaded policy reproduces the recorded ``logprobs`` and
importance ratios start at 1. On top of it:

* ``token_logprobs`` — each target token's logprob in a ``TokenBatch`` (gradients flow). With
  ``chunk_tokens`` the decoder runs once and the output head plus log-softmax run over that
  many positions at a time, each chunk recomputed in the backward pass (activation
  checkpointing) instead of kept: the full-vocabulary logits of a batch are the largest
  tensors of a step (SmolLM2's 49,152-token vocabulary: 16 rollouts of 300 tokens make 0.9 GB
  per float32 copy, and ``log_softmax`` with its backward holds several). The values are the
  one-shot ones up to float rounding;
* ``vocab_logprobs`` — the whole distribution at each response position of one sequence
  (OpenClaw's distillation compares it with a teacher's over the student's top-K);
* ``reference_logprobs`` — the frozen base (``with model.disable_adapter()``), no gradients;
* ``response_logprobs`` — per-sample response logprobs as lists, no gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from .data import Sample, TokenBatch, collate

#: positions whose logits exist at once with ``chunk_tokens`` (SmolLM2: 1024 x 49,152 float32 = 0.2 GB)
CHUNK_TOKENS = 1024

#: one temperature for every row (a number), or one per row (a sequence or a 1-d tensor)
Temperature = float | Sequence[float] | torch.Tensor


def scaled_log_softmax(logits: torch.Tensor, temperature: Temperature = 1.0) -> torch.Tensor:
    """``log_softmax(logits / T)`` over the last dimension, in float32; ``T <= 0`` is taken as 1.

    ``temperature`` is one number, or one per row of ``logits`` (its first dimension: records
    of one batch may have been sampled at different temperatures)."""
    logits = logits.float()
    if isinstance(temperature, (int, float)):
        t = float(temperature)
        return torch.log_softmax(logits / (t if t > 0 else 1.0), dim=-1)
    temps = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
    temps = torch.where(temps > 0, temps, torch.ones_like(temps))
    return torch.log_softmax(logits / temps.view(-1, *([1] * (logits.dim() - 1))), dim=-1)


def token_logprobs(model: Any, batch: TokenBatch, temperature: Temperature = 1.0, *,
                   chunk_tokens: int | None = None) -> torch.Tensor:
    """Each target token's logprob, ``[B, T - 1]`` aligned with ``batch.targets`` (mask it yourself).

    Gradients flow when called outside ``torch.no_grad()``. ``chunk_tokens`` (e.g.
    ``CHUNK_TOKENS``) bounds the positions whose full-vocabulary logits exist at once; None
    computes the batch's logits in one go. A model whose logits are not exactly
    ``head(decoder(...))`` (soft-capped, scaled) is always computed in one go.
    """
    parts = _decoder_and_head(model) if chunk_tokens is not None else None
    if parts is None:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits[:, :-1]
        return scaled_log_softmax(logits, temperature).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
    decoder, head = parts
    hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                     use_cache=False).last_hidden_state[:, :-1]
    rows, width, size = hidden.shape
    flat = hidden.reshape(rows * width, size)
    targets = batch.targets.reshape(-1)
    if isinstance(temperature, (int, float)):
        temps = torch.full((rows * width,), float(temperature), dtype=torch.float32, device=flat.device)
    else:
        temps = torch.as_tensor(temperature, dtype=torch.float32, device=flat.device).repeat_interleave(width)
    grad = torch.is_grad_enabled() and (flat.requires_grad or any(p.requires_grad for p in head.parameters()))
    step = max(1, int(chunk_tokens))
    out = []
    for start in range(0, rows * width, step):
        piece = slice(start, start + step)
        if grad:
            out.append(checkpoint(_head_logprobs, head, flat[piece], targets[piece], temps[piece], use_reentrant=False))
        else:
            out.append(_head_logprobs(head, flat[piece], targets[piece], temps[piece]))
    return torch.cat(out).view(rows, width)


def vocab_logprobs(model: Any, prompt_ids: Sequence[int], response_ids: Sequence[int],
                   temperature: float = 1.0) -> torch.Tensor:
    """The scaled log-softmax over the whole vocabulary at each response position of one
    ``prompt + response`` sequence, ``[R, V]`` (gradients flow); row ``t`` is the distribution
    response token ``t`` was drawn from."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(response_ids)], dtype=torch.long, device=device)
    p, r = len(prompt_ids), len(response_ids)
    return scaled_log_softmax(model(input_ids=ids).logits[0, p - 1:p - 1 + r], temperature)


def reference_logprobs(model: Any, batch: TokenBatch, temperature: Temperature = 1.0, *,
                       chunk_tokens: int | None = None) -> torch.Tensor:
    """Token logprobs under the frozen base model (the adapter disabled), without gradients."""
    with torch.no_grad(), model.disable_adapter():
        return token_logprobs(model, batch, temperature, chunk_tokens=chunk_tokens)


def response_logprobs(model: Any, samples: Sequence[Sample], pad_id: int, temperature: float = 1.0) -> list[list[float]]:
    """Per-sample logprobs of the response tokens under ``model`` (no gradients)."""
    device = next(model.parameters()).device
    batch = collate(samples, pad_id, device)
    with torch.no_grad():
        lp = token_logprobs(model, batch, temperature)
    out = []
    for i, s in enumerate(samples):
        start = len(s.prompt_ids) - 1
        out.append(lp[i, start : start + len(s.response_ids)].tolist())
    return out


def _head_logprobs(head: Any, hidden: torch.Tensor, targets: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    return scaled_log_softmax(head(hidden), temps).gather(-1, targets[:, None]).squeeze(-1)


def _decoder_and_head(model: Any) -> tuple[Any, Any] | None:
    """The decoder stack and output head of a (PEFT-wrapped) causal LM whose logits are exactly
    ``head(decoder(...).last_hidden_state)``; None for models that post-process their logits."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(inner, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0)
           for name in ("final_logit_softcapping", "logit_scale", "logits_scaling")):
        return None
    get_decoder = getattr(inner, "get_decoder", None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    decoder = get_decoder() if callable(get_decoder) else None
    if decoder is None or head is None or decoder is inner:
        return None
    return decoder, head
