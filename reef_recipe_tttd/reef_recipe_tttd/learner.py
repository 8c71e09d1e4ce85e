"""The TTT-Discover learner: one optimizer step per grid on the policy's LoRA, and the state
that outlives the process (Adam's moments), versioned with the candidate it produced::

    learner/
      state.json     format, variant, step counter, LoRA shape, recent step metrics
      optimizer.pt   Adam moments

``propose`` reads it from the serving release, so a restart or rollback resumes exactly there.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .advantages import entropic_loo_advantages, fold_kl, mean_baseline_advantages
from .loss import importance_sampling_loss

LEARNER_DIR = "learner"
STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.pt"
FORMAT = "reef-tttd-learner/1"
HISTORY = 50


@dataclass
class Rollout:
    """One recorded rollout of a grid: its tokens, sampling logprobs and reward."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    reward: float
    temperature: float = 1.0


@dataclass
class LearnerOptions:
    #: ``tttd`` (adaptive-β entropic LOO) or ``tttd-mean`` (group-mean baseline)
    variant: str = "tttd"
    lr: float = 4e-5
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    kl_coef: float = 0.1
    lora_rank: int = 32
    lora_alpha: int = 32
    lora_lm_head: bool = False
    device: str = "auto"
    seed: int = 0
    #: padded tokens (rows x longest row) forwarded and back-propagated at once; a longer
    #: rollout is a micro-batch of its own. Changes memory and speed, never the gradient.
    micro_batch_tokens: int = 512


@dataclass
class LearnerState:
    steps: int = 0
    rollouts_used: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


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


class Learner:
    """The policy's LoRA (from the serving release's adapter, or new) and its Adam optimizer."""

    def __init__(self, options: LearnerOptions, base: Any, adapter_dir: Path | None, learner_dir: Path | None,
                 *, pad_id: int, log: Any = None):
        from reef_train import load_trainable, seed_everything, trainable_parameters

        self.options = options
        self.pad_id = int(pad_id)
        self.log = log
        seed_everything(options.seed)
        lora: dict[str, Any] = {"r": options.lora_rank, "alpha": options.lora_alpha, "seed": options.seed,
                                "include_lm_head": options.lora_lm_head}
        if options.device != "auto":
            lora["device"] = options.device
        saved = read_state(learner_dir) if learner_dir is not None else None
        self.state = LearnerState(**{k: saved[k] for k in ("steps", "rollouts_used", "history") if k in saved}) \
            if saved else LearnerState()
        self.policy = load_trainable(base, adapter_dir, **lora)
        self.device = next(self.policy.parameters()).device
        params = trainable_parameters(self.policy)
        self.optimizer = torch.optim.Adam(params, lr=options.lr, betas=(options.beta1, options.beta2),
                                          eps=options.eps, weight_decay=options.weight_decay)
        if learner_dir is not None and (learner_dir / OPTIMIZER_FILE).is_file():
            try:
                self.optimizer.load_state_dict(torch.load(str(learner_dir / OPTIMIZER_FILE), map_location=self.device,
                                                          weights_only=True))
            except (ValueError, KeyError, RuntimeError) as exc:
                if log is not None:
                    log.warning("tttd: the saved Adam state does not fit (%s): its moments start at zero", exc)

    def step(self, groups: Sequence[Sequence[Rollout]]) -> dict[str, Any]:
        """One optimizer step on ``groups`` (each a list of rollouts of one parent). Returns its metrics.

        The loss is a sum over tokens, so the grid is forwarded and back-propagated in
        micro-batches of at most ``micro_batch_tokens`` padded tokens whose gradients add up to
        the whole grid's: the activations of one micro-batch are alive at a time, not the grid's."""
        from reef_train import CHUNK_TOKENS, Sample, collate, reference_logprobs, token_logprobs

        o = self.options
        rewards = [[r.reward for r in g] for g in groups]
        advs, betas = group_advantages(o.variant, rewards)
        rollouts = [r for g in groups for r in g]
        scalar = [a for group in advs for a in group]
        batch = collate([Sample(r.prompt_ids, r.response_ids, r.logprobs) for r in rollouts], self.pad_id, self.device)
        mask = batch.response_mask
        temps = torch.tensor([r.temperature for r in rollouts], dtype=torch.float32, device=self.device)
        advantages = mask * torch.tensor(scalar, dtype=torch.float32, device=self.device)[:, None]
        parts = micro_batches([len(r.prompt_ids) + len(r.response_ids) for r in rollouts], o.micro_batch_tokens)
        base_logp = torch.zeros_like(batch.old_logprobs)
        for rows in parts:
            index, sub = _rows(batch, rows)
            base_logp[index, :sub.targets.shape[1]] = reference_logprobs(self.policy, sub, temps[index],
                                                                         chunk_tokens=CHUNK_TOKENS)
        advantages, kl = fold_kl(advantages, batch.old_logprobs, base_logp, mask, o.kl_coef)
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        logp = torch.zeros_like(batch.old_logprobs)
        loss_sum = 0.0
        for rows in parts:
            index, sub = _rows(batch, rows)
            width = sub.targets.shape[1]
            part = token_logprobs(self.policy, sub, temps[index], chunk_tokens=CHUNK_TOKENS)
            piece, _ = importance_sampling_loss(part, sub.old_logprobs, advantages[index, :width], sub.response_mask)
            piece.backward()
            loss_sum += float(piece.detach())
            logp[index, :width] = part.detach()
        _, stats = importance_sampling_loss(logp, batch.old_logprobs, advantages, mask)
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        grad_norm = float(torch.sqrt(sum((p.grad.detach() ** 2).sum() for p in params))) if params else 0.0
        self.optimizer.step()  # no gradient clipping: the reference has none
        self.optimizer.zero_grad(set_to_none=True)
        flat = [a for g in advs for a in g]
        metrics = {
            "step": self.state.steps, "loss": loss_sum, "grad_norm": grad_norm,
            "kl_sampled": kl, "beta_mean": sum(betas) / len(betas), "beta_max": max(betas),
            "advantage_max": max(flat), "advantage_min": min(flat),
            "trained_rollouts": len(rollouts), "trained_tokens": int(stats["tokens"]),
            "ratio_mean": stats["ratio_mean"], "ratio_max": stats["ratio_max"],
            "rollout_logprob_abs_diff": float(((logp - batch.old_logprobs).abs() * mask).sum()
                                              / mask.sum().clamp(min=1.0)),
        }
        self.state.steps += 1
        self.state.rollouts_used += len(rollouts)
        self.state.history = (self.state.history + [metrics])[-HISTORY:]
        return metrics

    def save(self, artifact_dir: Path) -> Path:
        """Write ``adapter/`` and ``learner/`` into ``artifact_dir``; return ``learner/``."""
        from reef_train import save_adapter

        save_adapter(self.policy, artifact_dir)
        learner_dir = Path(artifact_dir) / LEARNER_DIR
        if learner_dir.exists():
            shutil.rmtree(learner_dir)
        learner_dir.mkdir(parents=True)
        torch.save(self.optimizer.state_dict(), str(learner_dir / OPTIMIZER_FILE))
        o = self.options
        state = {"format": FORMAT, "variant": o.variant, "steps": self.state.steps,
                 "rollouts_used": self.state.rollouts_used,
                 "lora": {"rank": o.lora_rank, "alpha": o.lora_alpha, "lm_head": o.lora_lm_head},
                 "history": self.state.history}
        (learner_dir / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
        return learner_dir


def micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Row indices grouped longest first, each group's ``rows x longest`` within ``budget``
    tokens (a row longer than ``budget`` alone): rollouts of one prompt pad little together."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _rows(batch: Any, rows: list[int]) -> tuple[torch.Tensor, Any]:
    """``rows`` of a right-padded ``TokenBatch``, cut to their longest sequence."""
    from reef_train import TokenBatch

    index = torch.tensor(rows, dtype=torch.long, device=batch.input_ids.device)
    width = int(batch.attention_mask[index].sum(dim=1).max())
    cut = slice(0, width - 1)
    return index, TokenBatch(batch.input_ids[index, :width], batch.attention_mask[index, :width],
                             batch.targets[index, cut], batch.response_mask[index, cut],
                             batch.old_logprobs[index, cut], batch.advantages[index, cut])


def read_state(learner_dir: Path | None) -> dict[str, Any] | None:
    if learner_dir is None:
        return None
    try:
        data = json.loads((Path(learner_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def reward_stats(rewards: Sequence[float]) -> dict[str, float]:
    """``reward_{min,max,mean,std,zero_fraction}`` of a grid."""
    n = len(rewards)
    mean = sum(rewards) / n
    return {"reward_min": min(rewards), "reward_max": max(rewards), "reward_mean": mean,
            "reward_std": math.sqrt(sum((r - mean) ** 2 for r in rewards) / n),
            "reward_zero_fraction": sum(1 for r in rewards if r == 0) / n}
