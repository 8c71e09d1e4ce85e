"""SAO's training step on ``reef_train``'s learner: its advantages (a critic with
skip-observation GAE, or group-normalised rewards in ``grpo_dis``) and its loss (DIS against the
recorded rollout logprobs). Everything else — the policy and critic copies of the base, their
optimizers, the learner state a release carries — is ``reef_train.Learner``'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from reef_train import Algorithm, Learner, Sample, collate, dis_loss, masked_mean, token_logprobs

from .advantages import group_normalized_advantages, length_adaptive_lambda, skip_observation_gae


@dataclass
class Rollout:
    """One scored single rollout: the recorded tokens, their sampling logprobs and temperature."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    temperature: float
    reward: float
    #: lineage steps the sampling release was behind the lineage head when the step ran (policy lag)
    lag: int = 0
    #: 1 for action tokens, 0 for observation tokens of the response (default: all actions)
    action_mask: list[int] | None = None
    #: the release that sampled it (None: the base model), for its lag behind the lineage head
    release_id: str | None = None


@dataclass(frozen=True)
class SAOAlgorithm(Algorithm):
    """One SAO optimizer step over a batch of single rollouts (``mode`` ``sao``: K critic updates,
    then one actor update once warmed up; ``grpo_dis``: one actor update, no critic)."""

    recipe: ClassVar[str] = "sao"
    counters: ClassVar[tuple[str, ...]] = ("actor_steps", "critic_steps", "rollouts_used")

    mode: str = "sao"
    #: the critic's learning rate (mode ``sao``); None in ``grpo_dis``, which has no critic
    critic_lr: float | None = 1e-3
    critic_steps_per_actor: int = 2
    num_critic_only_steps: int = 10
    eps_clip_low: float = 0.3
    eps_clip_high: float = 5.0
    lambda_alpha: float = 1.5
    gamma: float = 1.0

    def identity(self) -> dict[str, Any]:
        return {"mode": self.mode}  # a critic of one mode does not fit the other

    def warming_up(self, learner: Learner) -> bool:
        """Whether the learner's next step updates the critic only (mode ``sao``, first steps)."""
        return learner.critic is not None and learner.counters["steps"] < self.num_critic_only_steps

    def step(self, learner: Learner, rollouts: Sequence[Rollout]) -> dict[str, Any]:
        metrics: dict[str, Any] = {"step": learner.counters["steps"]}
        if self.mode == "grpo_dis":
            adv = group_normalized_advantages([r.reward for r in rollouts], [tuple(r.prompt_ids) for r in rollouts])
            dropped = sum(a is None for a in adv)
            rollouts = [r for r, a in zip(rollouts, adv) if a is not None]
            scalar_adv = [a for a in adv if a is not None]
            metrics["rollouts_dropped_ungrouped"] = dropped
            if not rollouts:
                metrics["rollouts_used"] = 0
                return metrics
        device = learner.device
        batch = collate([Sample(r.prompt_ids, r.response_ids, r.logprobs) for r in rollouts], learner.pad_id, device)
        mask = batch.response_mask * _action_mask(rollouts, batch.response_mask)
        temps = torch.tensor([r.temperature for r in rollouts], dtype=torch.float32, device=device)
        lags = [r.lag for r in rollouts]
        metrics.update(rollouts_used=len(rollouts), policy_lag_max=max(lags), policy_lag_mean=sum(lags) / len(lags),
                       reward_mean=sum(r.reward for r in rollouts) / len(rollouts))

        critic_updates = 0
        if self.mode == "grpo_dis":
            advantages = mask * torch.tensor(scalar_adv, dtype=torch.float32, device=device)[:, None]
        else:
            advantages, critic_updates = self._critic_phase(learner, batch, mask, rollouts, metrics)

        if self.warming_up(learner):
            with torch.no_grad():
                logp = token_logprobs(learner.policy, batch, temps)
            metrics["rollout_logprob_abs_diff"] = float(masked_mean((logp - batch.old_logprobs).abs(), mask))
            metrics["actor_updated"] = False
        else:
            learner.policy.train()
            logp = token_logprobs(learner.policy, batch, temps)
            loss, stats = dis_loss(logp, batch.old_logprobs, advantages, mask, self.eps_clip_low, self.eps_clip_high)
            metrics.update(pg_clipfrac=stats["pg_clipfrac"], rollout_logprob_abs_diff=stats["rollout_logprob_abs_diff"],
                           ratio_mean=stats["ratio_mean"], actor_loss=loss.item())
            metrics["actor_grad_norm"] = learner.optimizer_step(loss)
            metrics["actor_updated"] = True
        return learner.finish_step(metrics, actor_steps=int(metrics["actor_updated"]), critic_steps=critic_updates,
                                   rollouts_used=len(rollouts))

    def _critic_phase(self, learner: Learner, batch: Any, mask: torch.Tensor, rollouts: Sequence[Rollout],
                      metrics: dict[str, Any]) -> tuple[torch.Tensor, int]:
        """Advantages from the critic's values before this step's updates, then K critic updates
        towards the Monte-Carlo returns; returns (advantages, updates)."""
        critic = learner.critic
        assert critic is not None
        with torch.no_grad():
            values = critic.values(batch.input_ids, batch.attention_mask) * mask
        rewards = [r.reward for r in rollouts]
        lengths = mask.sum(dim=1).long().tolist()
        lams = [length_adaptive_lambda(n, self.lambda_alpha) for n in lengths]
        advantages, _ = skip_observation_gae(values, mask, rewards, gamma=self.gamma, lam=lams)
        _, returns = skip_observation_gae(values, mask, rewards, gamma=self.gamma, lam=1.0)
        metrics["critic_explained_variance"] = explained_variance(values, returns, mask)
        metrics["lambda_mean"] = sum(lams) / len(lams)
        norms, losses = [], []
        for _ in range(self.critic_steps_per_actor):
            critic.train()
            pred = critic.values(batch.input_ids, batch.attention_mask)
            loss = 0.5 * masked_mean((pred - returns) ** 2, mask)
            norms.append(learner.optimizer_step(loss, critic=True))
            losses.append(loss.item())
        metrics.update(critic_updates=len(norms), critic_grad_norm=max(norms) if norms else 0.0,
                       critic_loss=losses[-1] if losses else 0.0)
        return advantages, len(norms)


def _action_mask(rollouts: Sequence[Rollout], response_mask: torch.Tensor) -> torch.Tensor:
    """1 on action tokens: the whole response unless a rollout says which tokens are observations."""
    out = torch.ones_like(response_mask)
    for i, r in enumerate(rollouts):
        if r.action_mask is None:
            continue
        start = len(r.prompt_ids) - 1
        out[i, start:start + len(r.action_mask)] = torch.tensor(r.action_mask, dtype=out.dtype)
    return out


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 − Var(R − V) / Var(R)`` over the masked tokens; 0 when the returns do not vary."""
    keep = mask > 0
    r, v = returns[keep].double(), values[keep].double()
    if r.numel() < 2:
        return 0.0
    var_r = float(r.var(unbiased=False))
    if var_r <= 0.0 or not math.isfinite(var_r):
        return 0.0
    return 1.0 - float((r - v).var(unbiased=False)) / var_r
