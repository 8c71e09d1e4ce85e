"""reef-recipe-gepa: GEPA's reflective prompt evolution of the harness, on live traffic.

Built on the GEPA engine dspy-ai ships (the ``gepa`` package): Reef contributes the adapter
(``ReefHarnessAdapter``: episodes through the scenario's runtime with a candidate's harness,
live reports as the train set, the scenario's task suite as the validation set), the reflection
model (the runtime, or any OpenAI-compatible endpoint through ``dspy.LM``) and the state that
carries one GEPA run across growth steps, restarts and the release chain (``gepa/state.json``).

Hooks: the ``gepa`` recipe, the config group ``recipe/gepa.yaml``, and a start-up check that
refuses a scenario without a validation set (exit 2, naming the key).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from reef_core import hookimpl
from reef_core.kit import lazy_exports

# Each name imports its module on first use: every ``reef`` command loads this plugin, and the
# recipe imports GEPA's engine.
__getattr__ = lazy_exports(__name__, {
    ".adapter": ("ReefHarnessAdapter",),
    ".data": ("default_feedback", "train_examples"),
    ".models": ("DspyLM", "RuntimeLM"),
    ".recipe": ("GepaRecipe",),
})

RECIPE = "gepa"

__all__ = ["DspyLM", "GepaRecipe", "ReefHarnessAdapter", "RuntimeLM", "default_feedback", "train_examples"]


@hookimpl
def register_recipes(register: Any) -> None:
    register(RECIPE, f"{__name__}.recipe:GepaRecipe")


@hookimpl
def reef_config_dir() -> str:
    return os.fspath(Path(__file__).with_name("conf"))


@hookimpl
def startup(reef: Any) -> None:
    """Refuse to serve ``recipe=gepa`` for a scenario without a validation set (``evaluator.tasks``):
    one line naming the key, exit 2, before the first request."""
    if reef.learning is None or reef.settings.group("recipe")[0] != RECIPE:
        return
    from .recipe import GepaRecipe

    settings = reef.settings
    recipe = GepaRecipe(plugins=getattr(reef, "plugins", None))
    for scenario in sorted({settings.server.default_scenario, *settings.scenarios}):
        recipe.valset(settings, scenario)
