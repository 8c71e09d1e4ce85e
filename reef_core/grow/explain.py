"""What a server learns, said in one line at start-up, and what its gate still needs.

``learning_line`` is the line ``reef serve`` logs once the kernel has started: which recipe
learns what, from which reports, gated by which evaluator, and how to change it (or that
nothing is learnt, and how to turn learning on). ``gate_needs`` says when a scenario's gate
has no tasks the operator wrote and depends on the scenario's own graded traffic (the
``task_suite`` option ``traffic_tasks``), and what the fastest ways to give it tasks are;
``reef serve`` logs it as a warning and ``reef doctor`` reports it.
"""

from __future__ import annotations

import logging
from typing import Any

#: the overrides that turn learning on as ``scripts/serve`` does (docs/learning.md)
LEARNING_ON = "recipe=feedback_rules evaluator=traffic"
#: the mode that keeps recording but stops learning, for a scenario
_STOP = "reef mode {scenario} record_only"


def _first_sentence(text: str | None) -> str:
    """The first sentence of a docstring, on one line, without reST literals."""
    words = " ".join((text or "").split()).replace("``", "")
    end = words.find(". ")
    return (words[: end + 1] if end >= 0 else words).strip()


def learning_line(plan: Any, *, mode: str, loop_enabled: bool = True) -> str:
    """One line: what ``plan`` (a ``ScenarioPlan``) learns, from what, and how to change it."""
    scenario = plan.scenario
    if plan.recipe.update_target == "none":
        return (f"learning off: recipe {plan.recipe_name} records every request and report and learns nothing; "
                f"to learn from reports with feedback, serve with {LEARNING_ON} (scripts/serve does)")
    what = _first_sentence(type(plan.recipe).__doc__) or f"learns the {plan.recipe.update_target}"
    if not loop_enabled:
        state = "learning off (loop.enabled=false): "
    elif mode in ("auto", "manual"):
        state = "learning on" + (" (manual: `reef grow` starts each step): " if mode == "manual" else ": ")
    else:
        state = f"learning off for {scenario!r} (mode {mode}; `reef mode {scenario} auto` resumes it): "
    from .plan import max_batches  # not at import: plan pulls in the record filters

    most = max_batches(plan.recipe)
    backlog = f" (up to {plan.recipe.batch_size * most} at once when more wait)" if most > 1 else ""
    return (f"{state}recipe {plan.recipe_name}: {what.rstrip('.')}, a candidate every {plan.recipe.batch_size} "
            f"eligible report(s){backlog} of scenario {scenario!r}; gate: {plan.evaluator_name}, and a candidate it does "
            f"not select is never served. Change it with recipe=NAME evaluator=NAME (reef plugins lists them), "
            f"or stop learning with `{_STOP.format(scenario=scenario)}`")


def gate_needs(evaluator: Any) -> str | None:
    """Why ``evaluator`` gates on tasks the operator has not written, and the fastest way to give
    it tasks; None when its tasks are the operator's (or it runs no tasks at all)."""
    traffic = getattr(evaluator, "traffic_tasks", 0)
    if not traffic or getattr(evaluator, "tasks", None):
        return None
    return (f"the gate has no tasks of yours: it draws up to {traffic} from this scenario's reports whose metadata "
            "carries `pattern` (a regex a good answer matches) or `expected` (text it contains), never from the "
            "candidate's own batch, and publishes nothing while there are none. Fastest: post reports with "
            "metadata.pattern (README, 'Teach it'); or write tasks: evaluator.tasks=FILE.jsonl (docs/learning.md)")


def startup_notes(reef: Any) -> list[tuple[int, str]]:
    """(log level, line) ``reef serve`` logs once the kernel has started: the default scenario's
    ``learning_line``, then each configured scenario's ``gate_needs`` as a warning."""
    loop = reef.learning
    if loop is None:
        return []
    settings = reef.settings
    default = settings.server.default_scenario
    notes = [(logging.INFO, learning_line(loop.plan(default), mode=loop.mode(default),
                                          loop_enabled=settings.loop.enabled))]
    for scenario in sorted({default, *settings.scenarios}):
        need = gate_needs(loop.plan(scenario).evaluator)
        if need:
            notes.append((logging.WARNING, f"scenario {scenario!r}: {need}"))
    return notes
