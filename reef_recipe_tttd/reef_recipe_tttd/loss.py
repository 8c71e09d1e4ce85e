"""TTT-Discover's loss: un-clipped importance sampling, summed over every trained token.

``loss = −Σ_t exp(log πθ(t) − log q(t)) · A_t`` over the response tokens of the whole batch (Tinker's
``importance_sampling``): no PPO clip, no per-trajectory or per-token mean. ``q`` is the
sampling distribution the runtime recorded, so the ratio is 1 on the first (and only) step of
a grid and the gradient is ``−Σ A_t ∇ log πθ(t)``. The logprobs come from
``reef_train.token_logprobs`` with ``chunk_tokens`` (the output head and log-softmax over 1024
positions at a time: a grid's full-vocabulary logits are never alive at once).
"""

from __future__ import annotations

import torch


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
