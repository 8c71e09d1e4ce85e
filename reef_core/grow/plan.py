"""What a growth step of one scenario runs: its recipe, filters and evaluator, resolved once.

A scenario's plan is the root ``recipe`` with the scenario's ``recipe_options`` over its
options; the recipe's own filters, then the config's (``filters``, then
``scenarios.<s>.filters``); and the scenario's evaluator (``Settings.evaluator_for``: the
scenario's, else the root group, whose default ``recipe_default`` is the recipe's own
``default_evaluator``). The learning loop resolves the configured scenarios' plans at
start-up, so a configuration error stops the server before it serves, and a task suite too
small to ever select is logged as a warning there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..contracts import Evaluator, Recipe, RecordFilter
from ..observe import build_filters

if TYPE_CHECKING:
    from ..kernel import Reef

log = logging.getLogger("reef.grow")

#: evaluation timeout for evaluators that declare no ``timeout_s``
DEFAULT_EVAL_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class ScenarioPlan:
    """The resolved learning setup of one scenario (what ``run_step`` needs besides the kernel)."""

    scenario: str
    recipe_name: str
    recipe: Recipe
    filters: tuple[tuple[str, RecordFilter], ...]
    evaluator_name: str
    evaluator: Evaluator
    #: seconds the gate may take (the evaluator's ``timeout_s``, else ``DEFAULT_EVAL_TIMEOUT_S``)
    eval_timeout_s: float

    def describe(self) -> dict[str, Any]:
        """The plan as the scenario view shows it."""
        return {"recipe": self.recipe_name, "update_target": self.recipe.update_target,
                "batch_size": self.recipe.batch_size,
                "max_batches": max_batches(self.recipe), "filters": [name for name, _ in self.filters],
                "evaluator": self.evaluator_name}


def max_batches(recipe: Any) -> int:
    """How many full batches one step of ``recipe`` may take (``Recipe.max_batches``, at least 1)."""
    return max(int(getattr(recipe, "max_batches", 1)), 1)


def resolve_plan(reef: Reef, scenario: str) -> ScenarioPlan:
    """Build ``scenario``'s recipe, filters and evaluator from the kernel's settings."""
    settings = reef.settings
    name, options = settings.group("recipe")
    sc = settings.scenarios.get(scenario)
    if sc is not None and sc.recipe_options:
        options = {**options, **sc.recipe_options}
    recipe = reef.build("recipe", name, options)
    specs = list(recipe.filters or ()) + list(sc.filters if sc is not None else ())
    filters = build_filters(specs, reef.build)
    evaluator_name, evaluator_options = settings.evaluator_for(scenario)
    if evaluator_name is None:  # evaluator=recipe_default: the recipe says how it is judged
        evaluator_name = recipe.default_evaluator
    evaluator = reef.build("evaluator", evaluator_name, evaluator_options)
    problem = getattr(evaluator, "selection_problem", None)  # task_suite: a suite too small to select
    if callable(problem) and (text := problem()):
        log.warning("%s: evaluator %s: %s", scenario, evaluator_name, text)
    timeout = evaluator.timeout_s if evaluator.timeout_s is not None else DEFAULT_EVAL_TIMEOUT_S
    return ScenarioPlan(scenario=scenario, recipe_name=name, recipe=recipe, filters=tuple(filters),
                        evaluator_name=evaluator_name, evaluator=evaluator, eval_timeout_s=float(timeout))
