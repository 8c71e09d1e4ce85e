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

from .learner import Learner, LearnerOptions, TrainTurn


@dataclass(frozen=True)
class StepPayload:
    options: LearnerOptions
    turns: list[TrainTurn]
    #: where the served base says training goes (``cpu``, ``cuda:1``); ``auto`` on a remote
    #: worker, whose devices are its own (the ``device`` option, when set, wins either way)
    device: str | None = "auto"


@dataclass(frozen=True)
class StepBase:
    """The served base as the worker sees it (``reef_train.load_trainable`` reads ``path`` and ``device``)."""

    path: Path
    device: str | None = "auto"


def train_step(payload: StepPayload, inputs: dict[str, Path | None], output: Path) -> dict[str, Any]:
    """Continue the policy from ``inputs``, train it on the turns, write ``output/adapter``."""
    base_dir = inputs["base"]
    if base_dir is None:
        raise ValueError("the OpenClaw step needs the base model directory (inputs['base'])")
    learner = Learner(payload.options, StepBase(path=Path(base_dir), device=payload.device), inputs.get("adapter"))
    metrics = learner.train(payload.turns)
    learner.save(output)
    return metrics
