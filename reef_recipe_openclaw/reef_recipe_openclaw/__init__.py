"""reef-recipe-openclaw: OpenClaw-RL as a Reef recipe — learn from what happens next.

No reports are needed: a computed-feedback processor rebuilds sessions from served traffic,
pairs each main turn with the next request's trailing message (the user's next words or a
tool's result), asks a judge (PRM) whether that next state shows progress and what hint it
holds, and stores each turn that trains as a report. The recipe then trains the served model's
LoRA with binary RL (PPO on the turn's reward) plus hindsight-guided on-policy distillation
over the student's top-K tokens, which the runtime records for this recipe's scenarios only.

Hooks: the ``openclaw`` recipe, the config group ``recipe/openclaw.yaml``, and ``startup`` /
``shutdown``, which attach the computed-feedback service to a server whose recipe is
``openclaw`` (and refuse a runtime training cannot reach).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from reef_core import hookimpl
from reef_core.kit import lazy_exports

# Each name imports its module on first use: every ``reef`` command loads this plugin, and the
# learner imports torch.
__getattr__ = lazy_exports(__name__, {
    ".algorithm": ("OpenClawAlgorithm", "TrainTurn"),
    ".dispatch": ("Dispatch", "DispatchCounters", "dispatch"),
    ".judge": ("Judge", "OpenAIJudge", "RuntimeJudge", "build_judge", "register_judge", "unregister_judge"),
    ".loss": ("openclaw_loss", "select_candidates"),
    ".prm": ("JudgeResult", "aggregate_votes", "hint_candidates", "judge_turn", "parse_boxed", "parse_hint"),
    ".processor": ("ProcessorOptions", "TurnProcessor"),
    ".recipe": ("OpenClawRecipe",),
    ".service": ("OpenClawService",),
    ".sessions": ("BoundTurn", "NextState", "SessionIndex", "Turn"),
})

RECIPE = "openclaw"

__all__ = [
    "BoundTurn",
    "Dispatch",
    "DispatchCounters",
    "Judge",
    "JudgeResult",
    "NextState",
    "OpenAIJudge",
    "OpenClawAlgorithm",
    "OpenClawRecipe",
    "OpenClawService",
    "ProcessorOptions",
    "RuntimeJudge",
    "SessionIndex",
    "TrainTurn",
    "Turn",
    "TurnProcessor",
    "aggregate_votes",
    "build_judge",
    "dispatch",
    "hint_candidates",
    "judge_turn",
    "openclaw_loss",
    "parse_boxed",
    "parse_hint",
    "register_judge",
    "select_candidates",
    "unregister_judge",
]

#: the service of each running kernel (by id), so ``shutdown`` stops the one ``startup`` started
_services: dict[int, Any] = {}


@hookimpl
def register_recipes(register):
    register(RECIPE, f"{__name__}.recipe:OpenClawRecipe")


@hookimpl
def reef_config_dir():
    return os.fspath(Path(__file__).with_name("conf"))


@hookimpl
async def startup(reef: Any) -> None:
    """With ``recipe=openclaw``: refuse a runtime training cannot reach (one line, exit 2), then
    attach the computed-feedback service to this kernel (not in one-shot CLI kernels)."""
    if reef.learning is None or reef.settings.group("recipe")[0] != RECIPE:
        return
    from reef_train.startup import refuse_untrainable_runtime  # imports torch: only for this recipe

    if not refuse_untrainable_runtime(reef, RECIPE) or not reef.background:
        return
    from .recipe import OpenClawRecipe
    from .service import OpenClawService

    service = OpenClawService(reef, OpenClawRecipe)
    await service.start()
    reef.register(service, name="reef_recipe_openclaw.service")
    _services[id(reef)] = service


@hookimpl
async def shutdown(reef: Any) -> None:
    service = _services.pop(id(reef), None)
    if service is not None:
        reef.unregister(service)
        await service.stop()
