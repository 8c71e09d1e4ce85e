"""Grow: per-scenario workers turn eligible experience into candidates (recipes) and hand
them to Commit."""

from ..kit.lazy import lazy_exports

# Loaded on first use: importing ``grow.context`` (a recipe's ``RecipeContext``) must not build
# the learning loop, its config and its store.
__getattr__ = lazy_exports(__name__, {
    ".context": ("RecipeContext",),
    ".loop": ("LearningLoop",),
    ".plan": ("ScenarioPlan", "resolve_plan"),
    ".progress": ("LogProgress", "RichProgress"),
    ".step": ("StepResult",),
})

__all__ = ["LearningLoop", "LogProgress", "RecipeContext", "RichProgress", "ScenarioPlan", "StepResult", "resolve_plan"]
