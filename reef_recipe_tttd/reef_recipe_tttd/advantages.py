"""Per-group advantages of TTT-Discover: the adaptive-β entropic leave-one-out weights (a port
of ``discover@6c40e82``), the group-mean baseline of ``tttd-mean``, and the centred frozen-base
KL folded into per-token advantages.

Pure Python (the KL fold takes tensors), so every value here is unit-tested exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: KL(softmax(β·r) ‖ uniform) the solver aims for
TARGET_KL = math.log(2.0)
#: the doubling phase stops here
BETA_MAX = 1e6
BISECTIONS = 60


def softmax_kl_to_uniform(rewards: Sequence[float], beta: float) -> float:
    """KL(softmax(β·r) ‖ uniform) = Σ q_i·log(n·q_i)."""
    n = len(rewards)
    if n == 0:
        return 0.0
    top = max(rewards)
    weights = [math.exp(beta * (r - top)) for r in rewards]
    total = sum(weights)
    kl = 0.0
    for w in weights:
        q = w / total
        if q > 0.0:
            kl += q * math.log(n * q)
    return kl


def solve_beta(rewards: Sequence[float], target: float = TARGET_KL) -> float:
    """β such that KL(softmax(β·r) ‖ uniform) = ``target`` (capped at ln n − 1e-9, which the KL
    only approaches as β grows); 0 for fewer than two rewards.

    Start at 1 and double while the KL is still below the target (up to 1e6), then bisect 60
    times on [0, high] and return ``high``: the reference's order of operations, kept so the
    values match it."""
    n = len(rewards)
    if n < 2:
        return 0.0
    target = min(float(target), math.log(n) - 1e-9)
    high = 1.0
    while softmax_kl_to_uniform(rewards, high) < target and high < BETA_MAX:
        high *= 2.0
    low = 0.0
    for _ in range(BISECTIONS):
        mid = (low + high) / 2.0
        if softmax_kl_to_uniform(rewards, mid) < target:
            low = mid
        else:
            high = mid
    return high


def entropic_loo_advantages(rewards: Sequence[float], beta: float | None = None) -> tuple[list[float], float]:
    """``(advantages, β)`` of one group: ``e_i = exp(β(r_i − max r))`` and
    ``A_i = e_i / (mean_{j≠i} e_j + 1e-12) − 1``, with β from ``solve_beta`` unless given.

    The best samples get large positive weights and the rest about −1: the gradient of
    log E[exp(βR)], which seeks the maximum rather than the mean."""
    n = len(rewards)
    if n == 0:
        return [], 0.0
    if n == 1:
        return [0.0], 0.0
    b = solve_beta(rewards) if beta is None else float(beta)
    top = max(rewards)
    e = [math.exp(b * (r - top)) for r in rewards]
    total = sum(e)
    out = [e_i / ((total - e_i) / (n - 1) + 1e-12) - 1.0 for e_i in e]
    return out, b


def mean_baseline_advantages(rewards: Sequence[float]) -> list[float]:
    """``tttd-mean``: ``A_i = r_i − mean(r)``."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]


def fold_kl(advantages, rollout_logprobs, base_logprobs, mask, kl_coef: float):
    """Per-token advantages with the centred frozen-base KL folded in:
    ``diff_t = log q(t) − log p_base(t)`` on masked tokens, ``mean_diff`` its mean over the whole
    batch, and ``A_t ← A_t + kl_coef·(mean_diff − diff_t)``. Tensors ``[B, T]``; returns
    ``(advantages, mean_diff)`` (the sampled KL estimate, a metric)."""
    import torch

    with torch.no_grad():
        diff = (rollout_logprobs - base_logprobs) * mask
        count = mask.sum().clamp(min=1.0)
        mean_diff = diff.sum() / count
        folded = advantages + kl_coef * (mean_diff - diff) * mask
    return folded, float(mean_diff)
