"""reef-recipe-sao: SAO (Single-rollout Asynchronous Optimization) as a Reef recipe.

The policy's LoRA learns from scored single rollouts through DIS (decoupled importance
sampling against the recorded rollout logprobs), with a LoRA critic and skip-observation GAE
(``mode: sao``) or group-normalised advantages (``mode: grpo_dis``, the control arm). The
learner (policy and critic copies, optimizers, the state a release carries) is
``reef_train.Learner``; ``SAOAlgorithm`` is what SAO adds: its advantages and loss.

Hooks: the ``sao`` recipe, the ``single_reference`` record filter (reports quoting exactly one
record), the config group ``recipe/sao.yaml``, and a start-up check that refuses a runtime
that cannot give training the served base (and so records no token ids and logprobs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from reef_core import Experience, RecordFilter, hookimpl
from reef_core.kit import lazy_exports

# Each name imports its module on first use: every ``reef`` command loads this plugin, and the
# learner imports torch.
__getattr__ = lazy_exports(__name__, {
    ".advantages": ("group_normalized_advantages", "length_adaptive_lambda", "skip_observation_gae"),
    ".algorithm": ("Rollout", "SAOAlgorithm"),
    ".recipe": ("SAORecipe",),
})

RECIPE = "sao"

__all__ = [
    "Rollout",
    "SAOAlgorithm",
    "SAORecipe",
    "SingleReferenceFilter",
    "group_normalized_advantages",
    "length_adaptive_lambda",
    "skip_observation_gae",
]


class SingleReferenceFilter(RecordFilter):
    """Keeps reports that quote exactly one record (one rollout); reports quoting several are
    verdicts on a whole trial and do not train SAO."""

    def apply(self, items: list[Experience], ctx: Any) -> list[Experience]:
        return [e for e in items if len(e.records) == 1]


@hookimpl
def register_recipes(register):
    register(RECIPE, f"{__name__}.recipe:SAORecipe")


@hookimpl
def register_record_filters(register):
    register("single_reference", SingleReferenceFilter)


@hookimpl
def reef_config_dir():
    return os.fspath(Path(__file__).with_name("conf"))


@hookimpl
def startup(reef):
    """Refuse to serve ``recipe=sao`` on a runtime training cannot reach (e.g. ``upstream``):
    one line naming the recipe and the runtime, exit 2, before the first request."""
    if reef.learning is None or reef.settings.group("recipe")[0] != RECIPE:
        return
    from reef_train.startup import refuse_untrainable_runtime  # imports torch: only for this recipe

    refuse_untrainable_runtime(reef, RECIPE)
