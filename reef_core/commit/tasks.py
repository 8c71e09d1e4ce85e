"""Held-out tasks for evaluators: loading, grading, and paired candidate-vs-current episodes.

A task is ``{id?, prompt | messages, system?, expected?, pattern?, grader?}``. Each episode
sends the task through the scenario's runtime with one side's harness applied and grades
the answer with ``grader(output, task) -> float``. An episode that crashed (runtime error,
timeout, grader error) scores ``None``, which ranks below every real score; two crashed
sides tie.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..observe.experience import response_text
from ..types import ActiveRelease

log = logging.getLogger("reef.commit")

Grader = Callable[[str, dict[str, Any]], float]


# --------------------------------------------------------------------------- graders


def grade_exact(output: str, task: dict[str, Any]) -> float:
    """1.0 when the answer equals ``expected`` (surrounding whitespace ignored)."""
    return float(output.strip() == str(task["expected"]).strip())


def grade_contains(output: str, task: dict[str, Any]) -> float:
    """1.0 when ``expected`` occurs in the answer, ignoring case."""
    return float(str(task["expected"]).casefold() in output.casefold())


def grade_regex(output: str, task: dict[str, Any]) -> float:
    """1.0 when ``pattern`` (or ``expected`` read as a pattern) matches somewhere in the answer."""
    return float(re.search(task.get("pattern") or task["expected"], output, re.DOTALL) is not None)


BUILTIN_GRADERS: dict[str, Grader] = {"exact": grade_exact, "contains": grade_contains, "regex": grade_regex}
_NEEDS = {"exact": "expected", "contains": "expected", "regex": "pattern"}


# --------------------------------------------------------------------------- tasks


def load_tasks(tasks: Sequence[dict[str, Any]] | str, default_grader: str,
               graders: dict[str, Grader]) -> list[dict[str, Any]]:
    """Validated tasks from a list or a JSONL file path; every problem is a ConfigError."""
    if isinstance(tasks, (str, Path)):
        path = Path(tasks).expanduser()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read evaluation tasks file {str(path)!r}: {exc.strerror}") from None
        items = []
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{n}: not a JSON object ({exc.msg})") from None
    else:
        items = [dict(t) for t in tasks]
    if not items:
        raise ConfigError("evaluator needs at least one task (option 'tasks': a list or a JSONL file path)")
    out = []
    for n, task in enumerate(items, 1):
        if not isinstance(task, dict):
            raise ConfigError(f"evaluation task {n} is not an object")
        task = dict(task)
        task.setdefault("id", f"task-{n}")
        if not task.get("prompt") and not task.get("messages"):
            raise ConfigError(f"evaluation task {task['id']!r} needs 'prompt' or 'messages'")
        if not task.get("grader"):
            task["grader"] = "regex" if task.get("pattern") else default_grader
        grader = task["grader"]
        if grader not in graders:
            raise ConfigError(f"evaluation task {task['id']!r} names unknown grader {grader!r}; "
                              f"available: {', '.join(sorted(graders))}")
        need = _NEEDS.get(grader)
        if need and not task.get(need) and not (need == "pattern" and task.get("expected")):
            raise ConfigError(f"evaluation task {task['id']!r} uses grader {grader!r} and needs {need!r}")
        if grader == "regex":
            try:
                re.compile(task.get("pattern") or task["expected"])
            except re.error as exc:
                raise ConfigError(f"evaluation task {task['id']!r} has an invalid pattern: {exc}") from None
        out.append(task)
    return out


def task_body(task: dict[str, Any], dialect: str, model: str, params: dict[str, Any]) -> dict[str, Any]:
    """The request body of a task in the runtime's dialect."""
    messages = list(task.get("messages") or [{"role": "user", "content": task["prompt"]}])
    system = task.get("system")
    if dialect == "anthropic":
        rest = []
        for m in messages:
            if m.get("role") == "system":
                system = (system + "\n\n" if system else "") + str(m.get("content", ""))
            else:
                rest.append(m)
        body: dict[str, Any] = {"model": model, "max_tokens": 1024, "messages": rest, **params}
        if system:
            body["system"] = system
        return body
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return {"model": model, "messages": messages, **params}


# --------------------------------------------------------------------------- episodes


@dataclass
class PairedResult:
    tasks: list[str]
    candidate: list[float | None]
    current: list[float | None]
    errors: list[str]

    def compare(self) -> dict[str, int]:
        wins = losses = ties = 0
        for c, k in zip(self.candidate, self.current):
            rc = float("-inf") if c is None else c
            rk = float("-inf") if k is None else k
            if rc > rk:
                wins += 1
            elif rc < rk:
                losses += 1
            else:
                ties += 1
        return {"wins": wins, "losses": losses, "ties": ties}

    @staticmethod
    def mean(scores: list[float | None]) -> float:
        """Mean score, a crashed episode counting as 0."""
        return sum(s or 0.0 for s in scores) / len(scores) if scores else 0.0


def run_paired(tasks: list[dict[str, Any]], candidate: ActiveRelease, current: ActiveRelease | None,
               ctx: Any, graders: dict[str, Grader], *, model: str, params: dict[str, Any],
               repeats: int, episode_timeout_s: float, concurrency: int) -> PairedResult:
    """Run every task ``repeats`` times on each side, interleaved, and grade the answers."""
    errors: list[str] = []

    def episode(task: dict[str, Any], release: ActiveRelease | None) -> float | None:
        side = "candidate" if release is candidate else "current"
        try:
            body = task_body(task, ctx.dialect, task.get("model") or model, params)
            answer = response_text(ctx.complete(body, release, timeout_s=episode_timeout_s))
            return float(graders[task["grader"]](answer, task))
        except Exception as exc:  # noqa: BLE001 - a crashed episode scores None, the suite goes on
            errors.append(f"{task['id']} ({side}): {type(exc).__name__}: {exc}")
            return None
        finally:
            bar.advance()

    plan = [task for task in tasks for _ in range(repeats)]
    with ctx.progress.task(f"evaluating {len(plan)} paired episode(s)", total=2 * len(plan)) as bar:
        with ThreadPoolExecutor(max_workers=max(concurrency, 1), thread_name_prefix="reef-episode") as pool:
            futures = [(pool.submit(episode, t, candidate), pool.submit(episode, t, current)) for t in plan]
            cand = [f[0].result() for f in futures]
            cur = [f[1].result() for f in futures]
    return PairedResult(tasks=[t["id"] for t in plan], candidate=cand, current=cur, errors=errors)
