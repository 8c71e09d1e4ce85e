"""The SAO learner: one optimizer step over a batch of single rollouts, and the state that
must outlive the process, versioned with the candidate it produced.

Learner state, in a candidate artifact next to ``adapter/`` (the policy)::

    learner/
      state.json              format, mode, step counters, LoRA shape, recent step metrics
      critic/                 the critic's LoRA (PEFT directory; mode ``sao`` only)
      value_head.safetensors  the critic's value head (mode ``sao`` only)
      optimizer.pt            AdamW moments of the actor and the critic

``propose`` reads it from the serving release (``current.path / "learner"``), so a restart or
a rollback resumes from exactly the state behind the release that serves.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from reef_train.critic import ValueModel, load_critic

from .advantages import group_normalized_advantages, length_adaptive_lambda, skip_observation_gae

LEARNER_DIR = "learner"
STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.pt"
FORMAT = "reef-sao-learner/1"
#: step metrics kept in state.json (older ones are in the candidates' metadata)
HISTORY = 50


@dataclass
class Rollout:
    """One scored single rollout: the recorded tokens, their sampling logprobs and temperature."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    temperature: float
    reward: float
    #: releases the producing weights were behind the head when the step ran
    lag: int = 0
    #: 1 for action tokens, 0 for observation tokens of the response (default: all actions)
    action_mask: list[int] | None = None


@dataclass
class LearnerOptions:
    mode: str = "sao"
    lr: float = 2e-4
    critic_lr: float = 1e-3
    critic_steps_per_actor: int = 2
    num_critic_only_steps: int = 10
    eps_clip_low: float = 0.3
    eps_clip_high: float = 5.0
    lambda_alpha: float = 1.5
    gamma: float = 1.0
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_lm_head: bool = False
    max_grad_norm: float = 1.0
    device: str = "auto"
    seed: int = 0


@dataclass
class LearnerState:
    """The counters ``state.json`` holds."""

    steps: int = 0
    actor_steps: int = 0
    critic_steps: int = 0
    rollouts_used: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


class Learner:
    """Actor (the policy's LoRA) and, in mode ``sao``, the critic, loaded from a release."""

    def __init__(self, options: LearnerOptions, base: Any, adapter_dir: Path | None, learner_dir: Path | None,
                 *, pad_id: int, log: Any = None):
        from reef_train import load_trainable, make_optimizer, seed_everything

        self.options = options
        self.pad_id = int(pad_id)
        self.log = log
        seed_everything(options.seed)
        lora = {"r": options.lora_rank, "alpha": options.lora_alpha, "seed": options.seed}
        if options.device != "auto":
            lora["device"] = options.device
        saved = read_state(learner_dir) if learner_dir is not None else None
        if saved is not None and saved.get("mode") != options.mode:
            self._say("learner state of mode %r does not fit mode %r: starting a new critic", saved.get("mode"),
                      options.mode)
            saved, learner_dir = None, None
        self.state = LearnerState(**{k: saved[k] for k in ("steps", "actor_steps", "critic_steps", "rollouts_used",
                                                           "history") if k in saved}) if saved else LearnerState()
        self.actor = load_trainable(base, adapter_dir, include_lm_head=options.lora_lm_head, **lora)
        self.device = next(self.actor.parameters()).device
        self.actor_opt = make_optimizer(self.actor, lr=options.lr)
        self.critic: ValueModel | None = None
        self.critic_opt: torch.optim.Optimizer | None = None
        if options.mode == "sao":
            self.critic = load_critic(base, learner_dir, **lora)
            self.critic_opt = torch.optim.AdamW(self.critic.trainable(), lr=options.critic_lr, weight_decay=0.0)
        if learner_dir is not None and (learner_dir / OPTIMIZER_FILE).is_file():
            self._load_optimizers(learner_dir / OPTIMIZER_FILE)

    # ------------------------------------------------------------------ one step

    @property
    def warming_up(self) -> bool:
        """Whether the next step updates the critic only (mode ``sao``, first steps)."""
        return self.critic is not None and self.state.steps < self.options.num_critic_only_steps

    def step(self, rollouts: Sequence[Rollout]) -> dict[str, Any]:
        """One optimizer step: K critic updates, then one actor update once warmed up (``sao``);
        one actor update on group-normalised advantages (``grpo_dis``). Returns its metrics."""
        from reef_train import Sample, collate, token_logprobs

        o = self.options
        metrics: dict[str, Any] = {"step": self.state.steps}
        if o.mode == "grpo_dis":
            adv = group_normalized_advantages([r.reward for r in rollouts], [tuple(r.prompt_ids) for r in rollouts])
            dropped = sum(a is None for a in adv)
            rollouts = [r for r, a in zip(rollouts, adv) if a is not None]
            scalar_adv = [a for a in adv if a is not None]
            metrics["rollouts_dropped_ungrouped"] = dropped
            if not rollouts:
                metrics["rollouts_used"] = 0
                return metrics
        samples = [Sample(r.prompt_ids, r.response_ids, r.logprobs) for r in rollouts]
        batch = collate(samples, self.pad_id, self.device)
        mask = batch.response_mask * self._action_mask(rollouts, batch.response_mask)
        temps = torch.tensor([r.temperature for r in rollouts], dtype=torch.float32, device=self.device)
        lags = [r.lag for r in rollouts]
        metrics.update(rollouts_used=len(rollouts), policy_lag_max=max(lags), policy_lag_mean=sum(lags) / len(lags),
                       reward_mean=sum(r.reward for r in rollouts) / len(rollouts))

        if o.mode == "grpo_dis":
            advantages = mask * torch.tensor(scalar_adv, dtype=torch.float32, device=self.device)[:, None]
        else:
            advantages = self._critic_phase(batch, mask, rollouts, metrics)

        if self.warming_up:
            with torch.no_grad():
                logp = token_logprobs(self.actor, batch, temps)
            metrics["rollout_logprob_abs_diff"] = float(_masked_mean((logp - batch.old_logprobs).abs(), mask))
            metrics["actor_updated"] = False
        else:
            from reef_train import dis_loss, optimizer_step

            self.actor.train()
            logp = token_logprobs(self.actor, batch, temps)
            loss, stats = dis_loss(logp, batch.old_logprobs, advantages, mask, o.eps_clip_low, o.eps_clip_high)
            metrics.update(pg_clipfrac=stats["pg_clipfrac"], rollout_logprob_abs_diff=stats["rollout_logprob_abs_diff"],
                           ratio_mean=stats["ratio_mean"], actor_loss=loss.item())
            metrics["actor_grad_norm"] = optimizer_step(self.actor, self.actor_opt, loss, o.max_grad_norm)
            metrics["actor_updated"] = True
            self.state.actor_steps += 1
        self.state.steps += 1
        self.state.rollouts_used += len(rollouts)
        self.state.history = (self.state.history + [metrics])[-HISTORY:]
        return metrics

    def _critic_phase(self, batch: Any, mask: torch.Tensor, rollouts: Sequence[Rollout],
                      metrics: dict[str, Any]) -> torch.Tensor:
        """Advantages from the critic's values before this step's updates, then K critic updates
        towards the Monte-Carlo returns."""
        o = self.options
        critic = self.critic
        assert critic is not None and self.critic_opt is not None
        with torch.no_grad():
            values = critic.values(batch.input_ids, batch.attention_mask) * mask
        rewards = [r.reward for r in rollouts]
        lengths = mask.sum(dim=1).long().tolist()
        lams = [length_adaptive_lambda(n, o.lambda_alpha) for n in lengths]
        advantages, _ = skip_observation_gae(values, mask, rewards, gamma=o.gamma, lam=lams)
        _, returns = skip_observation_gae(values, mask, rewards, gamma=o.gamma, lam=1.0)
        metrics["critic_explained_variance"] = explained_variance(values, returns, mask)
        metrics["lambda_mean"] = sum(lams) / len(lams)
        norms, losses = [], []
        for _ in range(o.critic_steps_per_actor):
            critic.train()
            pred = critic.values(batch.input_ids, batch.attention_mask)
            loss = 0.5 * _masked_mean((pred - returns) ** 2, mask)
            self.critic_opt.zero_grad(set_to_none=True)
            loss.backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(critic.trainable(), o.max_grad_norm)))
            self.critic_opt.step()
            self.critic_opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            self.state.critic_steps += 1
        metrics.update(critic_updates=len(norms), critic_grad_norm=max(norms) if norms else 0.0,
                       critic_loss=losses[-1] if losses else 0.0)
        return advantages

    @staticmethod
    def _action_mask(rollouts: Sequence[Rollout], response_mask: torch.Tensor) -> torch.Tensor:
        """1 on action tokens: the whole response unless a rollout says which tokens are observations."""
        out = torch.ones_like(response_mask)
        for i, r in enumerate(rollouts):
            if r.action_mask is None:
                continue
            start = len(r.prompt_ids) - 1
            out[i, start:start + len(r.action_mask)] = torch.tensor(r.action_mask, dtype=out.dtype)
        return out

    # ------------------------------------------------------------------ state

    def save(self, artifact_dir: Path) -> Path:
        """Write ``adapter/`` (the policy) and ``learner/`` into ``artifact_dir``; return ``learner/``."""
        from reef_train import save_adapter

        save_adapter(self.actor, artifact_dir)
        return self.save_learner(Path(artifact_dir) / LEARNER_DIR)

    def save_learner(self, learner_dir: Path) -> Path:
        import shutil

        if learner_dir.exists():
            shutil.rmtree(learner_dir)
        learner_dir.mkdir(parents=True)
        if self.critic is not None:
            self.critic.save(learner_dir)
        optim = {"actor": self.actor_opt.state_dict()}
        if self.critic_opt is not None:
            optim["critic"] = self.critic_opt.state_dict()
        torch.save(optim, str(learner_dir / OPTIMIZER_FILE))
        o = self.options
        state = {"format": FORMAT, "mode": o.mode, "steps": self.state.steps, "actor_steps": self.state.actor_steps,
                 "critic_steps": self.state.critic_steps, "rollouts_used": self.state.rollouts_used,
                 "lora": {"rank": o.lora_rank, "alpha": o.lora_alpha, "lm_head": o.lora_lm_head},
                 "history": self.state.history}
        (learner_dir / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
        return learner_dir

    def _load_optimizers(self, path: Path) -> None:
        saved = torch.load(str(path), map_location=self.device, weights_only=True)
        pairs = [("actor", self.actor_opt)] + ([("critic", self.critic_opt)] if self.critic_opt is not None else [])
        for name, opt in pairs:
            if name not in saved:
                continue
            try:
                _check_shapes(opt, saved[name])
                opt.load_state_dict(saved[name])
            except (ValueError, KeyError) as exc:
                self._say("the %s optimizer state does not fit (%s): its moments start at zero", name, exc)

    def _say(self, message: str, *args: Any) -> None:
        if self.log is not None:
            self.log.warning(message, *args)


def read_state(learner_dir: Path) -> dict[str, Any] | None:
    """``state.json`` of a ``learner/`` directory, None when there is none or another format."""
    try:
        data = json.loads((Path(learner_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


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


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def _check_shapes(opt: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Raise ValueError when ``saved`` moments do not have the shapes of ``opt``'s parameters."""
    params = [p for g in opt.param_groups for p in g["params"]]
    ids = [i for g in saved.get("param_groups", []) for i in g["params"]]
    if len(ids) != len(params):
        raise ValueError(f"{len(ids)} saved parameters for {len(params)}")
    state = saved.get("state", {})
    for i, p in zip(ids, params):
        moments = state.get(i) or state.get(str(i)) or {}
        avg = moments.get("exp_avg")
        if avg is not None and tuple(avg.shape) != tuple(p.shape):
            raise ValueError(f"a moment of shape {tuple(avg.shape)} for a parameter of shape {tuple(p.shape)}")
