"""SAO's advantage estimators, as pure functions over per-token tensors.

Every tensor is ``[B, T]`` and aligned like ``reef_train.TokenBatch.targets``: position ``t``
holds the value of the state before token ``t`` and whether token ``t`` is an action (a token the
policy sampled) or an observation (prompt, tool output: context it did not choose).

- ``length_adaptive_lambda``: ``λ = 1 − 1/(α·L)`` clamped to [0, 1], ``L`` the response's action
  length: long answers bootstrap less from a young critic's values.
- ``skip_observation_gae``: GAE over action tokens only. The recurrence skips observation
  tokens, so the TD residual of an action's last token bridges to the first token of the next
  action; observations get advantage 0. The scalar reward sits on the last action token.
- ``group_normalized_advantages``: the GRPO control arm's ``(R − mean) / (std + eps)`` per group
  of rollouts of one prompt (unbiased std, as Slime computes it).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def length_adaptive_lambda(length: int, alpha: float = 1.5) -> float:
    """``1 − 1/(α·L)`` clamped to [0, 1]; 0 for an empty response."""
    if length <= 0:
        return 0.0
    return min(max(1.0 - 1.0 / (alpha * length), 0.0), 1.0)


def skip_observation_gae(
    values: torch.Tensor,
    action_mask: torch.Tensor,
    rewards: Sequence[float] | torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float | Sequence[float] = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` of each row, 0 outside ``action_mask``.

    With actions at positions ``a_0 < … < a_{n−1}``: ``δ_k = r_k + γ·V(a_{k+1}) − V(a_k)`` (``V`` past
    the last action is 0, ``r_k`` is the row's reward at ``k = n−1`` and 0 before), and
    ``A_k = δ_k + γ·λ·A_{k+1}``. ``returns = advantages + values`` (with ``λ = 1``: the
    Monte-Carlo return, the critic's target). ``lam`` is one value or one per row.
    """
    rows, width = action_mask.shape
    lams = [float(lam)] * rows if isinstance(lam, (int, float)) else [float(x) for x in lam]
    rewards = [float(r) for r in (rewards.tolist() if isinstance(rewards, torch.Tensor) else rewards)]
    if len(lams) != rows or len(rewards) != rows:
        raise ValueError(f"skip_observation_gae needs one reward and one lambda per row ({rows} rows)")
    v = values.detach().double().cpu().tolist()
    m = action_mask.detach().cpu().tolist()
    adv = [[0.0] * width for _ in range(rows)]
    for i in range(rows):
        actions = [t for t in range(width) if m[i][t] > 0]
        running, next_value = 0.0, 0.0
        for k in range(len(actions) - 1, -1, -1):
            t = actions[k]
            reward = rewards[i] if k == len(actions) - 1 else 0.0
            delta = reward + gamma * next_value - v[i][t]
            running = delta + gamma * lams[i] * running
            adv[i][t] = running
            next_value = v[i][t]
    advantages = torch.tensor(adv, dtype=values.dtype, device=values.device)
    returns = (advantages + values.detach()) * action_mask.to(values.dtype)
    return advantages, returns


def group_normalized_advantages(rewards: Sequence[float], groups: Sequence[Hashable],
                                eps: float = 1e-6) -> list[float | None]:
    """``(R − mean) / (std + eps)`` within each group (unbiased std); None for a rollout whose
    group has fewer than two members (no baseline to compare with)."""
    if len(rewards) != len(groups):
        raise ValueError("group_normalized_advantages needs one group key per reward")
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(groups):
        members.setdefault(key, []).append(i)
    out: list[float | None] = [None] * len(rewards)
    for idx in members.values():
        if len(idx) < 2:
            continue
        r = torch.tensor([float(rewards[i]) for i in idx], dtype=torch.float64)
        normalized = (r - r.mean()) / (r.std() + eps)
        for i, a in zip(idx, normalized.tolist()):
            out[i] = a
    return out
