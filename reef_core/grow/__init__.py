"""Grow: per-scenario workers turn eligible experience into candidates (recipes) and hand
them to Commit."""

from .context import RecipeContext
from .loop import LearningLoop
from .plan import ScenarioPlan, resolve_plan
from .progress import LogProgress, RichProgress
from .step import StepResult

__all__ = ["LearningLoop", "LogProgress", "RecipeContext", "RichProgress", "ScenarioPlan", "StepResult", "resolve_plan"]
