"""The learner every weight recipe trains through: a recipe says what its advantages and loss
are (an ``Algorithm``); the ``Learner`` does the rest.

* ``Learner`` — the trainable LoRA policy on a copy of the served base, a critic beside it when
  the algorithm has one (``reef_train.critic``), their optimizers (``LoraOptions``: AdamW or
  Adam, clipping), step counters, the recipe's JSON-able state and recent step metrics; loaded
  from and saved to one checkpoint (``reef_train.checkpoint``), so training resumes exactly;
* ``Algorithm`` — the recipe's part: ``step(learner, batch)`` computes advantages and the loss
  with ``reef_train.logprobs`` and ``learner.optimizer_step``, then ``learner.finish_step``;
* ``train_step`` — load, run the payload's steps, save: the step function every trainer
  backend runs (in process or as one Ray task; ``reef_train.backend``), and ``run_steps``,
  what a recipe's ``propose`` calls to run it into a candidate's artifact.
"""

from __future__ import annotations

import logging
import shutil
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import torch

from .backend import Trainer, base_input
from .checkpoint import (
    ADAPTER_DIR,
    HISTORY,
    LEARNER_DIR,
    OPTIMIZER_FILE,
    LearnerState,
    check_moments,
    read_learner_state,
    read_optimizers,
    write_atomically,
    write_state,
)
from .critic import ValueModel, load_critic
from .data import Sample
from .divergence import kl_to_reference
from .optim import make_optimizer, optimizer_step
from .options import LoraOptions
from .policy import load_tokenizer, load_trainable, save_adapter, seed_everything
from .stopping import check as check_stop

_log = logging.getLogger("reef.train")


class Algorithm(ABC):
    """A recipe's training step: its advantages and its loss. Subclasses are picklable values
    (a dataclass of the recipe's options): the payload carries them to a Ray worker."""

    #: the recipe's name; a checkpoint records it and is never resumed by another recipe
    recipe: ClassVar[str] = ""
    #: counters the recipe keeps beside ``steps`` (each starts at 0)
    counters: ClassVar[tuple[str, ...]] = ()
    #: the critic's learning rate when the recipe trains one beside the policy; None: no critic
    critic_lr: float | None = None

    def identity(self) -> dict[str, Any]:
        """Recipe state a checkpoint must match to be resumed (SAO: its ``mode``); kept in it."""
        return {}

    @abstractmethod
    def step(self, learner: Learner, batch: Any) -> dict[str, Any]:
        """One training step on ``batch``: compute the loss, ``learner.optimizer_step``, then
        ``learner.finish_step(metrics, ...)`` (skip it when the batch held nothing to learn
        from: the learner is then not saved). Returns the step's metrics."""


class Learner:
    """The policy (and critic) of one recipe, their optimizers, counters and recipe state.

    ``adapter`` is the LoRA the policy continues from (None: a new one shaped by ``options``);
    ``state`` a ``learner/`` directory to resume (counters, recipe state, critic, moments).
    A state of another recipe, or whose recipe state differs from ``algorithm.identity()``, is
    not resumed (logged): the learner starts afresh on the given adapter. With
    ``resume_optimizer`` False the optimizer moments start at zero whatever the state holds.
    """

    def __init__(self, algorithm: Algorithm, options: LoraOptions, base: Any, *, adapter: str | Path | None = None,
                 state: str | Path | None = None, pad_id: int | None = None, resume_optimizer: bool = True,
                 log: logging.Logger | None = None):
        self.algorithm = algorithm
        self.options = options
        self.base = base
        self.log = log or _log
        self._pad_id = pad_id
        seed_everything(options.seed)
        state_dir = Path(state) if state is not None else None
        saved = read_learner_state(state_dir)
        if saved is not None and (problem := self._misfit(saved)):
            self.log.warning("the learner state in %s %s: its counters, critic and optimizer moments start afresh",
                             state_dir, problem)
            saved = None
        #: the ``learner/`` directory this learner resumed, None: a new learner state
        self.resumed = state_dir if saved is not None else None
        self.counters: dict[str, int] = {"steps": 0, **{k: 0 for k in algorithm.counters},
                                         **(saved.counters if saved else {})}
        self.recipe_state: dict[str, Any] = {**(saved.recipe_state if saved else {}), **algorithm.identity()}
        self.history: list[dict[str, Any]] = list(saved.history) if saved else []
        lora = options.lora()
        self.policy = load_trainable(base, adapter, **lora)
        self.device = next(self.policy.parameters()).device
        o = options
        self.optimizer = make_optimizer(self.policy, o.lr, o.weight_decay, kind=o.optimizer,
                                        betas=(o.beta1, o.beta2), eps=o.eps)
        self.critic: ValueModel | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        if algorithm.critic_lr is not None:
            lora.pop("include_lm_head")  # the critic reads hidden states, never the output layer
            self.critic = load_critic(base, state_dir if saved is not None and saved.critic else None, **lora)
            self.critic_optimizer = make_optimizer(self.critic, algorithm.critic_lr, o.weight_decay, kind=o.optimizer,
                                                   betas=(o.beta1, o.beta2), eps=o.eps,
                                                   params=self.critic.trainable())
        if saved is not None and resume_optimizer and (state_dir / OPTIMIZER_FILE).is_file():
            self._load_optimizers(state_dir / OPTIMIZER_FILE)

    @property
    def pad_id(self) -> int:
        """The padding id batches are collated with (the tokenizer's pad, else its eos)."""
        if self._pad_id is None:
            tokenizer = load_tokenizer(self.base)
            pad = tokenizer.pad_token_id
            self._pad_id = int(pad if pad is not None else tokenizer.eos_token_id)
        return self._pad_id

    # ------------------------------------------------------------------ training

    def step(self, batch: Any) -> dict[str, Any]:
        """One training step of the algorithm on ``batch``; its metrics."""
        return self.algorithm.step(self, batch)

    def zero_grad(self) -> None:
        """Clear the gradients before accumulating a loss over several ``backward`` calls."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic_optimizer is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self, loss: torch.Tensor | None = None, *, critic: bool = False) -> float:
        """Back-propagate ``loss`` (None: the gradients are already accumulated), clip the
        gradient norm to ``max_grad_norm`` (None: no clipping), step the policy's optimizer (the
        critic's with ``critic``) and clear the gradients. Returns the norm before clipping.
        Raises ``reef_train.Stopped`` instead when the step was asked to stop."""
        check_stop()
        if critic:
            if self.critic is None or self.critic_optimizer is None:
                raise RuntimeError(f"the {self.algorithm.recipe} learner has no critic")
            return optimizer_step(self.critic.trainable(), self.critic_optimizer, loss, self.options.max_grad_norm)
        return optimizer_step(self.policy, self.optimizer, loss, self.options.max_grad_norm)

    def finish_step(self, metrics: dict[str, Any], **counts: int) -> dict[str, Any]:
        """Count one step (and ``counts`` into the recipe's counters), keep its metrics."""
        self.counters["steps"] += 1
        for name, n in counts.items():
            self.counters[name] = self.counters.get(name, 0) + int(n)
        self.history = (self.history + [metrics])[-HISTORY:]
        return metrics

    # ------------------------------------------------------------------ checkpoint

    def state(self) -> LearnerState:
        o = self.options
        return LearnerState(recipe=self.algorithm.recipe, counters=dict(self.counters),
                            recipe_state=dict(self.recipe_state),
                            lora={"rank": o.lora_rank, "alpha": o.lora_alpha, "lm_head": o.lora_lm_head},
                            critic=self.critic is not None, history=list(self.history))

    def save(self, directory: str | Path) -> Path:
        """Write the checkpoint (``adapter/`` and ``learner/``) into ``directory`` atomically
        (``reef_train.checkpoint.write_atomically``); returns ``directory``."""

        def write(tmp: Path) -> None:
            save_adapter(self.policy, tmp)
            learner_dir = tmp / LEARNER_DIR
            learner_dir.mkdir()
            if self.critic is not None:
                self.critic.save(learner_dir)
            moments = {"policy": self.optimizer.state_dict()}
            if self.critic_optimizer is not None:
                moments["critic"] = self.critic_optimizer.state_dict()
            torch.save(moments, str(learner_dir / OPTIMIZER_FILE))
            write_state(learner_dir, self.state())

        return write_atomically(directory, write)

    def _misfit(self, saved: LearnerState) -> str | None:
        if saved.recipe != self.algorithm.recipe:
            return f"is recipe {saved.recipe!r}'s, not {self.algorithm.recipe!r}'s"
        for key, value in self.algorithm.identity().items():
            if saved.recipe_state.get(key) != value:
                return f"was trained with {key} {saved.recipe_state.get(key)!r}, not {value!r}"
        return None

    def _load_optimizers(self, path: Path) -> None:
        try:
            saved = read_optimizers(path, self.device)
        except Exception as exc:  # an unreadable file: the moments start at zero
            self.log.warning("the optimizer state %s cannot be read (%s): its moments start at zero", path, exc)
            return
        parts = [("policy", self.optimizer)] + ([("critic", self.critic_optimizer)] if self.critic_optimizer else [])
        for name, optimizer in parts:
            if name not in saved:
                continue
            try:
                check_moments(optimizer, saved[name])
                optimizer.load_state_dict(saved[name])
            except (ValueError, KeyError, RuntimeError) as exc:
                self.log.warning("the %s optimizer state does not fit (%s): its moments start at zero", name, exc)


# ---------------------------------------------------------------------- the step a backend runs


@dataclass(frozen=True)
class StepPayload:
    """What ``train_step`` needs besides directories (picklable: it travels to a Ray worker)."""

    algorithm: Algorithm
    options: LoraOptions
    #: one batch per training step, in order
    batches: list[Any]
    #: where the served base says training goes (``cpu``, ``cuda:1``); ``auto`` on a remote
    #: worker, whose devices are its own (``options.device``, when set, wins either way)
    device: str | None = "auto"
    #: resume the optimizer moments from the ``learner`` input (False: they start at zero)
    resume_optimizer: bool = True
    #: recent rollouts serving sampled, to measure the trained policy's KL to serving on
    #: (``reef_train.divergence``; the ``reference`` input is serving's adapter, None the base);
    #: None: not measured
    kl_samples: list[Sample] | None = None
    #: the temperature each of ``kl_samples`` was sampled at
    kl_temperatures: list[float] | None = None


def train_step(payload: StepPayload, inputs: Mapping[str, Path | None], output: Path) -> dict[str, Any]:
    """Load the learner from ``inputs`` (``base``, ``adapter``, ``learner``), run every batch's
    step, and save the checkpoint into ``output`` when a step trained. Returns
    ``{"steps": [metrics of each step], "counters": ..., "resumed": whether a state was resumed,
    "kl": the trained policy's KL to serving (``inputs["reference"]``) on ``payload.kl_samples``,
    None when not measured}``."""
    algorithm = payload.algorithm
    learner = Learner(algorithm, payload.options, base_input(inputs, algorithm.recipe, device=payload.device),
                      adapter=inputs.get("adapter"), state=inputs.get("learner"),
                      resume_optimizer=payload.resume_optimizer, log=logging.getLogger(f"reef.recipe.{algorithm.recipe}"))
    start = learner.counters["steps"]
    steps = []
    for batch in payload.batches:
        check_stop()
        steps.append(learner.step(batch))
    kl = None
    if learner.counters["steps"] > start:
        check_stop()  # the last point where a stop leaves nothing behind
        if payload.kl_samples:
            kl = kl_to_reference(learner.policy, payload.kl_samples, learner.pad_id, payload.kl_temperatures or 1.0,
                                 reference_adapter=inputs.get("reference"))
        learner.save(output)
    return {"steps": steps, "counters": dict(learner.counters), "resumed": learner.resumed is not None, "kl": kl}


def run_steps(trainer: Trainer, payload: StepPayload, *, base: Any, adapter: str | Path | None,
              state: str | Path | None, output: str | Path, reference: str | Path | None = None,
              stop: threading.Event | None = None) -> dict[str, Any]:
    """Run ``train_step`` on ``trainer`` for a recipe's ``propose``: ``base`` is the served base
    (``reef_core.ServedBase``), ``adapter`` and ``state`` what the learner continues from, and
    ``output`` (a candidate's artifact) gets the new ``adapter/`` and ``learner/`` in place of
    the ones it held; ``reference`` is the serving adapter ``payload.kl_samples`` measure the KL
    to (None: the base). A ``TrainerError`` (the step failed or was lost on Ray) propagates. Once
    ``stop`` is set (a recipe passes ``ctx.stopping``) the step ends early with ``Stopped``."""
    out = Path(output)
    for part in (ADAPTER_DIR, LEARNER_DIR):  # the step writes them afresh (a remote one over this copy)
        shutil.rmtree(out / part, ignore_errors=True)
    device = getattr(base, "device", None) if trainer.options.backend == "local" else "auto"
    return trainer.run(train_step, replace(payload, device=device), output=out, stop=stop,
                       inputs={"base": base.path, "adapter": adapter, "learner": state, "reference": reference})
