"""TTT-Discover's training step on ``reef_train``'s learner: one Adam step per grid on the
policy's LoRA. The policy, its Adam, and the state a candidate carries (``learner/``: the
moments, counters, recent step metrics) are ``reef_train.Learner``'s; ``propose`` resumes it
from the serving release, so a restart or rollback continues exactly there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from reef_train import (
    CHUNK_TOKENS,
    Algorithm,
    Learner,
    Sample,
    collate,
    micro_batches,
    reference_logprobs,
    token_logprobs,
)

from .advantages import entropic_loo_advantages, fold_kl, mean_baseline_advantages
from .loss import importance_sampling_loss


@dataclass
class Rollout:
    """One recorded rollout of a grid: its tokens, sampling logprobs and reward."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    reward: float
    temperature: float = 1.0


def group_advantages(variant: str, groups: Sequence[Sequence[float]]) -> tuple[list[list[float]], list[float]]:
    """Per-group advantages and each group's β (0 for ``tttd-mean``)."""
    advs, betas = [], []
    for rewards in groups:
        if variant == "tttd-mean":
            advs.append(mean_baseline_advantages(rewards))
            betas.append(0.0)
        else:
            a, b = entropic_loo_advantages(rewards)
            advs.append(a)
            betas.append(b)
    return advs, betas


@dataclass(frozen=True)
class TTTDAlgorithm(Algorithm):
    """One Adam step per grid: entropic leave-one-out (or group-mean) advantages, the centred
    frozen-base KL folded in, the un-clipped importance-sampling token sum."""

    recipe: ClassVar[str] = "tttd"
    counters: ClassVar[tuple[str, ...]] = ("rollouts_used",)

    #: ``tttd`` (adaptive-β entropic LOO) or ``tttd-mean`` (group-mean baseline)
    variant: str = "tttd"
    kl_coef: float = 0.1
    #: padded tokens (rows x longest row) forwarded and back-propagated at once; a longer
    #: rollout is a micro-batch of its own. Changes memory and speed, never the gradient.
    micro_batch_tokens: int = 512

    def step(self, learner: Learner, groups: Sequence[Sequence[Rollout]]) -> dict[str, Any]:
        """One optimizer step on ``groups`` (each a list of rollouts of one parent). Returns its metrics.

        The loss is a sum over tokens, so the grid is forwarded and back-propagated in
        micro-batches of at most ``micro_batch_tokens`` padded tokens whose gradients add up to
        the whole grid's: the activations of one micro-batch are alive at a time, not the grid's."""
        rewards = [[r.reward for r in g] for g in groups]
        advs, betas = group_advantages(self.variant, rewards)
        rollouts = [r for g in groups for r in g]
        scalar = [a for group in advs for a in group]
        device = learner.device
        batch = collate([Sample(r.prompt_ids, r.response_ids, r.logprobs) for r in rollouts], learner.pad_id, device)
        mask = batch.response_mask
        temps = torch.tensor([r.temperature for r in rollouts], dtype=torch.float32, device=device)
        advantages = mask * torch.tensor(scalar, dtype=torch.float32, device=device)[:, None]
        parts = micro_batches([len(r.prompt_ids) + len(r.response_ids) for r in rollouts], self.micro_batch_tokens)
        base_logp = torch.zeros_like(batch.old_logprobs)
        for rows in parts:
            index, sub = batch.rows(rows)
            base_logp[index, :sub.targets.shape[1]] = reference_logprobs(learner.policy, sub, temps[index],
                                                                         chunk_tokens=CHUNK_TOKENS)
        advantages, kl = fold_kl(advantages, batch.old_logprobs, base_logp, mask, self.kl_coef)
        learner.policy.train()
        learner.zero_grad()
        logp = torch.zeros_like(batch.old_logprobs)
        loss_sum = 0.0
        for rows in parts:
            index, sub = batch.rows(rows)
            width = sub.targets.shape[1]
            part = token_logprobs(learner.policy, sub, temps[index], chunk_tokens=CHUNK_TOKENS)
            piece, _ = importance_sampling_loss(part, sub.old_logprobs, advantages[index, :width], sub.response_mask)
            piece.backward()
            loss_sum += float(piece.detach())
            logp[index, :width] = part.detach()
        _, stats = importance_sampling_loss(logp, batch.old_logprobs, advantages, mask)
        grad_norm = learner.optimizer_step()  # max_grad_norm None: no clipping, the reference has none
        flat = [a for g in advs for a in g]
        metrics = {
            "step": learner.counters["steps"], "loss": loss_sum, "grad_norm": grad_norm,
            "kl_sampled": kl, "beta_mean": sum(betas) / len(betas), "beta_max": max(betas),
            "advantage_max": max(flat), "advantage_min": min(flat),
            "trained_rollouts": len(rollouts), "trained_tokens": int(stats["tokens"]),
            "ratio_mean": stats["ratio_mean"], "ratio_max": stats["ratio_max"],
            "rollout_logprob_abs_diff": float(((logp - batch.old_logprobs).abs() * mask).sum()
                                              / mask.sum().clamp(min=1.0)),
        }
        learner.recipe_state["variant"] = self.variant
        return learner.finish_step(metrics, rollouts_used=len(rollouts))


def reward_stats(rewards: Sequence[float]) -> dict[str, float]:
    """``reward_{min,max,mean,std,zero_fraction}`` of a grid."""
    n = len(rewards)
    mean = sum(rewards) / n
    return {"reward_min": min(rewards), "reward_max": max(rewards), "reward_mean": mean,
            "reward_std": math.sqrt(sum((r - mean) ** 2 for r in rewards) / n),
            "reward_zero_fraction": sum(1 for r in rewards if r == 0) / n}
