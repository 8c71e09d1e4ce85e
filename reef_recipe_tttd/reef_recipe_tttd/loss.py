"""TTT-Discover's loss: un-clipped importance sampling, summed over every trained token.

``loss = −Σ_t exp(log πθ(t) − log q(t)) · A_t`` over the response tokens of the whole batch (Tinker's
``importance_sampling``): no PPO clip, no per-trajectory or per-token mean. ``q`` is the
sampling distribution the runtime recorded, so the ratio is 1 on the first (and only) step of
a grid and the gradient is ``−Σ A_t ∇ log πθ(t)``.

Memory: the full-vocabulary logits of a grid are the largest tensors of a step (SmolLM2's
49,152-token vocabulary: 16 rollouts of 300 tokens make 0.9 GB per float32 copy, and
``log_softmax(logits / T)`` with its backward holds several). ``row_logprobs`` therefore runs
the decoder once and the output head plus log-softmax over chunks of positions, each chunk
recomputed in the backward pass (activation checkpointing) instead of kept; the values are
those of the one-shot ``full_row_logprobs``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

#: positions whose logits exist at once (SmolLM2: 1024 x 49,152 float32 = 0.2 GB)
CHUNK_TOKENS = 1024


def importance_sampling_loss(logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, advantages: torch.Tensor,
                             mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """``(loss, {"ratio_mean", "ratio_max", "tokens"})``; every tensor ``[B, T − 1]``."""
    ratio = torch.exp((logprobs - rollout_logprobs) * mask)
    loss = -(ratio * advantages * mask).sum()
    with torch.no_grad():
        count = mask.sum().clamp(min=1.0)
        stats = {"ratio_mean": float((ratio * mask).sum() / count),
                 "ratio_max": float((ratio * mask).max()) if mask.any() else 1.0,
                 "tokens": float(mask.sum())}
    return loss, stats


def _row_temperatures(temperatures: torch.Tensor) -> torch.Tensor:
    return torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))


def full_row_logprobs(model: Any, batch: Any, temperatures: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits / T_row)`` of each target token (the runtime's recording convention),
    one temperature per row, ``T <= 0`` taken as 1; the whole batch's logits at once."""
    t = _row_temperatures(temperatures)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   use_cache=False).logits[:, :-1].float()
    logp = torch.log_softmax(logits / t[:, None, None], dim=-1)
    return logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)


def _head_logprobs(head: Any, hidden: torch.Tensor, targets: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float() / temps[:, None]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


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


def row_logprobs(model: Any, batch: Any, temperatures: torch.Tensor, *, chunk_tokens: int = CHUNK_TOKENS) -> torch.Tensor:
    """``full_row_logprobs`` without the batch's full-vocabulary logits: the output head and
    log-softmax run over ``chunk_tokens`` positions at a time, and under autograd each chunk is
    recomputed in the backward pass rather than stored. ``[B, T − 1]``."""
    parts = _decoder_and_head(model)
    if parts is None:
        return full_row_logprobs(model, batch, temperatures)
    decoder, head = parts
    t = _row_temperatures(temperatures)
    hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                     use_cache=False).last_hidden_state[:, :-1]
    rows, width, size = hidden.shape
    flat = hidden.reshape(rows * width, size)
    targets = batch.targets.reshape(-1)
    temps = t.to(flat.device, torch.float32).repeat_interleave(width)
    grad = torch.is_grad_enabled() and (flat.requires_grad or any(p.requires_grad for p in head.parameters()))
    out = []
    for start in range(0, rows * width, max(1, int(chunk_tokens))):
        piece = slice(start, start + max(1, int(chunk_tokens)))
        if grad:
            out.append(checkpoint(_head_logprobs, head, flat[piece], targets[piece], temps[piece], use_reentrant=False))
        else:
            out.append(_head_logprobs(head, flat[piece], targets[piece], temps[piece]))
    return torch.cat(out).view(rows, width)
