"""reef-recipe-tttd: TTT-Discover (test-time training on one hard problem) as a Reef recipe,
with its search harness.

The recipe (``recipe=tttd``) trains the served model's LoRA once per complete G×R grid of
scored attempts: adaptive-β entropic leave-one-out advantages, the centred frozen-base KL folded
in, the un-clipped importance-sampling token-sum loss, one Adam step (``TTTDAlgorithm`` on
``reef_train``'s learner, in process or as a Ray task: the ``trainer`` option). The search harness
(``reef tttd run TASK``, or ``SearchHarness``) is an ordinary Reef client: a PUCT archive
picks parents, the policy samples through Reef, a sandboxed judge scores, every attempt is
reported at its grid coordinate and the archive commits once the step's release serves.
Guidance-TTT (``GuidanceAttempt``) trains a guide while a frozen executor writes solutions.

Hooks: the ``tttd`` recipe, the ``tttd_grid`` record filter, the config group
``recipe/tttd.yaml``, the ``reef tttd`` commands, and a start-up check that refuses a runtime
training cannot reach (except for ``variant: search-only``, which trains nothing).
"""

from __future__ import annotations

import os
from pathlib import Path

from reef_core import hookimpl
from reef_core.kit import lazy_exports

# Each name imports its module on first use: every ``reef`` command loads this plugin, and the
# learner imports torch.
__getattr__ = lazy_exports(__name__, {
    ".advantages": ("entropic_loo_advantages", "fold_kl", "mean_baseline_advantages", "solve_beta"),
    ".algorithm": ("Rollout", "TTTDAlgorithm"),
    ".archive": ("Child", "Node", "PUCTArchive"),
    ".grid": ("GridError", "GridFilter", "barrier", "informative_groups"),
    ".guidance": ("GuidanceAttempt", "OpenAIExecutor", "keyword_executor", "parse_guidance", "register_executor"),
    ".harness": ("DirectAttempt", "Outcome", "SearchHarness", "SearchSettings", "StepAborted", "StepFailed"),
    ".judge": ("Judge", "Limits"),
    ".loss": ("importance_sampling_loss",),
    ".recipe": ("TTTDRecipe",),
    ".tasks": ("CirclePacking", "NumericSpread", "Task", "Verdict", "load_task"),
})

RECIPE = "tttd"

__all__ = [
    "Child",
    "CirclePacking",
    "DirectAttempt",
    "GridError",
    "GridFilter",
    "GuidanceAttempt",
    "Judge",
    "Limits",
    "Node",
    "NumericSpread",
    "OpenAIExecutor",
    "Outcome",
    "PUCTArchive",
    "Rollout",
    "SearchHarness",
    "SearchSettings",
    "StepAborted",
    "StepFailed",
    "TTTDAlgorithm",
    "TTTDRecipe",
    "Task",
    "Verdict",
    "barrier",
    "entropic_loo_advantages",
    "fold_kl",
    "importance_sampling_loss",
    "informative_groups",
    "keyword_executor",
    "load_task",
    "mean_baseline_advantages",
    "parse_guidance",
    "register_executor",
    "solve_beta",
]


@hookimpl
def register_recipes(register):
    register(RECIPE, f"{__name__}.recipe:TTTDRecipe")


@hookimpl
def register_record_filters(register):
    register("tttd_grid", f"{__name__}.grid:GridFilter")


@hookimpl
def register_commands(cli):
    from .cli import tttd  # click only: the search harness is imported when a search runs

    cli.add_command(tttd)


@hookimpl
def reef_config_dir():
    return os.fspath(Path(__file__).with_name("conf"))


@hookimpl
def startup(reef):
    """Refuse to serve ``recipe=tttd`` on a runtime training cannot reach (e.g. ``upstream``),
    unless the variant is ``search-only``: one line naming the recipe and the runtime, exit 2."""
    if reef.learning is None or reef.settings.group("recipe")[0] != RECIPE:
        return
    from reef_train.startup import refuse_untrainable_runtime  # imports torch: only for this recipe

    refuse_untrainable_runtime(reef, RECIPE, exempt=lambda options: options.get("variant") == "search-only",
                               note="; variant=search-only needs no training")
