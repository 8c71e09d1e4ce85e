"""The ``basic`` recipe: record-only. It stores experience and never proposes an update.

It is the default so a new deployment can check that requests, receipts and feedback
work before turning learning on.
"""

from __future__ import annotations

from typing import Any

from ..contracts import Recipe
from ..hookspecs import hookimpl


class BasicRecipe(Recipe):
    """Keeps every record and report; proposes nothing."""

    update_target = "none"
    filters: tuple[str, ...] = ()
    batch_size = 0
    default_evaluator = "always"

    def propose(self, batch: Any, current: Any, ctx: Any) -> None:
        return None


@hookimpl
def register_recipes(register):
    register("basic", BasicRecipe)
