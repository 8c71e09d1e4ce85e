"""The built-in task graders (``exact``, ``contains``, ``regex``) and the full set a Reef has.

A grader is ``fn(output, task) -> float`` (``reef_core.Grader``). The ``task_suite`` evaluator
grades held-out tasks with them; a recipe that scores its own episodes (GEPA's validation
set) uses the same functions through ``graders_of(plugins)``, so both grade alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import regex

Grader = Callable[[str, Mapping[str, Any]], float]
#: the longest a ``regex`` grader's match may take: a pattern that backtracks catastrophically
#: (``(a|aa)+$``, from a task or a client's report) fails its episode instead of holding a core
#: for hours. Matching runs in the ``regex`` module with the GIL released, so serving goes on.
REGEX_TIMEOUT_S = 1.0


def grade_exact(output: str, task: Mapping[str, Any]) -> float:
    """1.0 when the answer equals ``expected`` (surrounding whitespace ignored)."""
    return float(output.strip() == str(task["expected"]).strip())


def grade_contains(output: str, task: Mapping[str, Any]) -> float:
    """1.0 when ``expected`` occurs in the answer, ignoring case."""
    return float(str(task["expected"]).casefold() in output.casefold())


def grade_regex(output: str, task: Mapping[str, Any]) -> float:
    """1.0 when ``pattern`` (or ``expected`` read as a pattern) matches somewhere in the answer;
    ``TimeoutError`` (the episode fails) past ``REGEX_TIMEOUT_S``."""
    try:
        found = regex.search(task.get("pattern") or task["expected"], output, regex.DOTALL,
                             timeout=REGEX_TIMEOUT_S, concurrent=True)
    except TimeoutError:
        raise TimeoutError(f"the regex grader's pattern took over {REGEX_TIMEOUT_S:g} s on this answer") from None
    return float(found is not None)


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a ``regex`` grader's pattern (None: it can)."""
    try:
        regex.compile(pattern, regex.DOTALL)
    except regex.error as exc:
        return str(exc)
    return None


#: the graders every Reef has, by the name tasks give in ``grader``
BUILTIN_GRADERS: dict[str, Grader] = {"exact": grade_exact, "contains": grade_contains, "regex": grade_regex}


def graders_of(plugins: Any) -> dict[str, Grader]:
    """The built-in graders and those the installed plugins registered (``register_graders``);
    ``plugins`` is the ``plugins`` service a constructor may declare, or None."""
    graders = dict(BUILTIN_GRADERS)
    registry = getattr(plugins, "registry", None) or {}
    for name, reg in (registry.get("grader") or {}).items():
        graders[name] = getattr(reg, "obj", reg)
    return graders
