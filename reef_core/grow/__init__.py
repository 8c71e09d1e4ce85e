"""Grow: per-scenario workers turn eligible experience into candidates (recipes) and hand
them to Commit."""

from .context import RecipeContext
from .loop import LearningLoop
from .progress import LogProgress, RichProgress
from .step import StepResult

__all__ = ["LearningLoop", "LogProgress", "RecipeContext", "RichProgress", "StepResult"]
