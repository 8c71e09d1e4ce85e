"""The OpenClaw training step as a function a trainer backend runs (``reef_train.make_trainer``):
in the server's process (``trainer.backend: local``, the default) or as one Ray task (``ray``).

``train_step(payload, inputs, output)``:

* ``payload`` — a ``StepPayload``: the learner options, the judged turns with their teachers'
  prompt ids already rendered (the recipe tokenizes them; the worker needs no conversation),
  and the device to train on (picklable: it travels to a Ray worker);
* ``inputs`` — ``base`` (the served base model's directory) and ``adapter`` (the LoRA the
  policy continues from, None: a fresh one);
* ``output`` — receives the new ``adapter/``.

It returns the step's metrics (``Learner.train``'s).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef_train import base_input

from .learner import Learner, LearnerOptions, TrainTurn


@dataclass(frozen=True)
class StepPayload:
    options: LearnerOptions
    turns: list[TrainTurn]
    #: where the served base says training goes (``cpu``, ``cuda:1``); ``auto`` on a remote
    #: worker, whose devices are its own (the ``device`` option, when set, wins either way)
    device: str | None = "auto"


def train_step(payload: StepPayload, inputs: dict[str, Path | None], output: Path) -> dict[str, Any]:
    """Continue the policy from ``inputs``, train it on the turns, write ``output/adapter``."""
    learner = Learner(payload.options, base_input(inputs, "OpenClaw", device=payload.device), inputs.get("adapter"))
    metrics = learner.train(payload.turns)
    learner.save(output)
    return metrics
