"""The token-loss pieces the recipes share: importance ratios, PPO's clipped surrogate
(OpenClaw's RL and distillation terms) and decoupled importance sampling (DIS, SAO's policy
loss). Per-token tensors are ``[B, T - 1]``, aligned with ``TokenBatch.targets``; ``mask`` is
the response mask. A recipe's own loss (TTT-Discover's importance-sampling sum, OpenClaw's
combination) lives with the recipe."""

from __future__ import annotations

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1 (0 where nothing is masked in)."""
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def importance_ratios(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor | None = None, *,
                      log_ratio_clamp: float | None = None) -> torch.Tensor:
    """Per-token ``π_new / π_old`` = ``exp(logp - old_logp)``; 1 outside the mask (None: every
    token counts). ``log_ratio_clamp`` bounds the log-ratio before the exponential (OpenClaw's ±20)."""
    log_ratio = logprobs - old_logprobs
    if mask is not None:
        log_ratio = log_ratio * mask
    if log_ratio_clamp is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    return torch.exp(log_ratio)


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float = 0.2,
                      clip_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token, to maximise: ``min(r·A, clip(r, 1 - low, 1 + high)·A)``,
    and where the clip bit (bool). ``clip_high`` (default ``clip_low``) allows "clip-higher"."""
    high = clip_low if clip_high is None else clip_high
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + high)
    return torch.minimum(ratio * advantages, clipped * advantages), (ratio - clipped).abs() > 1e-8


def dis_weights(ratio: torch.Tensor, eps_low: float = 0.3, eps_high: float = 5.0) -> tuple[torch.Tensor, torch.Tensor]:
    """DIS's token weights: ``(f(r), kept)`` with ``kept`` where ``1 - eps_low < r < 1 + eps_high``
    (both bounds strict) and ``f(r) = r`` on kept tokens, 0 elsewhere (no gradient through either)."""
    r = ratio.detach()
    kept = (r > 1.0 - eps_low) & (r < 1.0 + eps_high)
    return torch.where(kept, r, torch.zeros_like(r)), kept


def dis_loss(
    logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.3,
    eps_high: float = 5.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled importance sampling against the engine-recorded rollout logprobs (SAO's policy
    loss): per token ``-sg(f(r)) · A · log π``, ``r = exp(log π - log π_rollout)``, token-mean over
    ``mask``. Tokens outside the band are hard-masked: no PPO min/max, no KL, no entropy.

    Returns ``(loss, {"pg_clipfrac", "ratio_mean", "rollout_logprob_abs_diff"})``: the fraction
    of masked-in tokens the band removed, their mean ratio, and ``mean |log π - log π_rollout|``.
    """
    ratio = importance_ratios(logprobs.detach(), rollout_logprobs, mask)
    weight, kept = dis_weights(ratio, eps_low, eps_high)
    loss = -masked_mean(weight * advantages * logprobs, mask)
    with torch.no_grad():
        stats = {
            "pg_clipfrac": float(masked_mean((~kept).float(), mask)),
            "ratio_mean": float(masked_mean(ratio, mask)),
            "rollout_logprob_abs_diff": float(masked_mean((logprobs.detach() - rollout_logprobs).abs(), mask)),
        }
    return loss, stats
