"""``PolicyTrainer``: the usual policy-gradient loop around the toolkit's pieces."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from .data import Sample, collate
from .logprobs import reference_logprobs, token_logprobs
from .losses import kl_penalty, policy_gradient_loss, ppo_clip_loss
from .optim import make_optimizer, optimizer_step
from .policy import save_adapter, seed_everything


class PolicyTrainer:
    """A policy-gradient step over ``Sample`` batches: REINFORCE or PPO-clip, optional KL
    to the frozen base, AdamW on the LoRA weights, deterministic given ``seed``.

    ``loss="reinforce"`` ignores the recorded logprobs; ``loss="ppo"`` uses them as the
    behaviour policy (fall back to the current policy's own logprobs when a sample has none).
    """

    def __init__(
        self,
        model: Any,
        *,
        pad_id: int,
        lr: float = 1e-4,
        loss: str = "ppo",
        clip_low: float = 0.2,
        clip_high: float | None = None,
        kl_coef: float = 0.0,
        temperature: float = 1.0,
        max_grad_norm: float | None = 1.0,
        seed: int | None = None,
    ):
        if loss not in ("ppo", "reinforce"):
            raise ValueError(f"Unknown loss {loss!r}; use 'ppo' or 'reinforce'.")
        if seed is not None:
            seed_everything(seed)
        self.model = model
        self.pad_id = pad_id
        self.loss = loss
        self.clip_low, self.clip_high = clip_low, clip_high
        self.kl_coef = kl_coef
        self.temperature = temperature
        self.max_grad_norm = max_grad_norm
        self.optimizer = make_optimizer(model, lr=lr)
        self.device = next(model.parameters()).device
        self.steps = 0

    def step(self, samples: Sequence[Sample]) -> dict[str, float]:
        self.model.train()
        batch = collate(samples, self.pad_id, self.device)
        mask = batch.response_mask
        logp = token_logprobs(self.model, batch, self.temperature)
        metrics: dict[str, float] = {}
        if self.loss == "reinforce":
            loss = policy_gradient_loss(logp, batch.advantages, mask)
        else:
            old = batch.old_logprobs
            missing = [i for i, s in enumerate(samples) if s.logprobs is None]
            if missing:
                old = old.clone()
                old[missing] = logp.detach()[missing]
            loss, stats = ppo_clip_loss(logp, old, batch.advantages, mask, self.clip_low, self.clip_high)
            metrics.update(stats)
        if self.kl_coef:
            ref = reference_logprobs(self.model, batch, self.temperature)
            kl = kl_penalty(logp, ref, mask)
            loss = loss + self.kl_coef * kl
            metrics["kl"] = kl.item()
        metrics["loss"] = loss.item()
        metrics["grad_norm"] = optimizer_step(self.model, self.optimizer, loss, self.max_grad_norm)
        self.steps += 1
        return metrics

    def fit(
        self,
        batches: Callable[[int], Sequence[Sample]] | Iterable[Sequence[Sample]],
        steps: int,
        *,
        desc: str = "train",
        progress: bool = True,
    ) -> list[dict[str, float]]:
        """Run ``steps`` steps; ``batches`` is a callable ``step -> samples`` or an iterable."""
        source = batches if callable(batches) else None
        iterator = None if source else iter(batches)
        history = []
        bar = tqdm(range(steps), desc=desc, disable=not progress, leave=False)
        for i in bar:
            samples = source(i) if source else next(iterator)
            metrics = self.step(samples)
            history.append(metrics)
            bar.set_postfix(loss=f"{metrics['loss']:.4f}")
        return history

    def save(self, artifact_dir: str | Path) -> Path:
        return save_adapter(self.model, artifact_dir)
