"""The SAO training step as a function a trainer backend runs (``reef_train.make_trainer``):
in the server's process (``trainer.backend: local``, the default) or as one Ray task (``ray``).

``train_step(payload, inputs, output)``:

* ``payload`` — a ``StepPayload``: the learner options, the rollouts of each optimizer step,
  the pad id and the device to train on (picklable: it travels to a Ray worker);
* ``inputs`` — ``base`` (the served base model's directory), ``adapter`` (the LoRA the policy
  continues from, None: a fresh one) and ``learner`` (the learner state it resumes, None: a
  new critic);
* ``output`` — receives ``adapter/`` and ``learner/`` when the policy moved, ``learner/`` alone
  when only the critic learned (warm-up), nothing when no rollout was used.

It returns ``{"steps": [metrics of each optimizer step], "state": the learner's counters}``;
``SAORecipe.propose`` aggregates them into the candidate's metadata.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef_train import base_input

from .learner import LEARNER_DIR, Learner, LearnerOptions, Rollout

log = logging.getLogger("reef.recipe.sao")


@dataclass(frozen=True)
class StepPayload:
    options: LearnerOptions
    #: the rollouts of each optimizer step of the candidate, in order
    chunks: list[list[Rollout]]
    pad_id: int
    #: where the served base says training goes (``cpu``, ``cuda:1``); ``auto`` on a remote
    #: worker, whose devices are its own (the ``device`` option, when set, wins either way)
    device: str | None = "auto"


def train_step(payload: StepPayload, inputs: dict[str, Path | None], output: Path) -> dict[str, Any]:
    """Load the learner from ``inputs``, run every optimizer step, write what changed to ``output``."""
    base = base_input(inputs, "SAO", device=payload.device)
    learner = Learner(payload.options, base, inputs.get("adapter"), inputs.get("learner"), pad_id=payload.pad_id,
                      log=log)
    steps = [learner.step(chunk) for chunk in payload.chunks]
    if any(m.get("actor_updated") for m in steps):
        learner.save(output)
    elif any(m.get("rollouts_used", 0) for m in steps):
        learner.save_learner(Path(output) / LEARNER_DIR)  # critic only: the recipe keeps it as warm-up
    state = learner.state
    return {"steps": steps, "state": {"steps": state.steps, "actor_steps": state.actor_steps,
                                      "critic_steps": state.critic_steps, "rollouts_used": state.rollouts_used}}
