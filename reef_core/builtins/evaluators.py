"""The standard evaluators (``always``, ``task_suite``, ``threshold``) and graders.

``task_suite`` and ``threshold`` run the same held-out tasks through the scenario's runtime
with the candidate's harness and with the current release's, paired episode by episode;
they differ only in how they decide. Evaluation is fail-closed by the gate
(``reef_core.commit.gate``): any exception or timeout rejects the candidate.
"""

from __future__ import annotations

from typing import Any

from ..commit.tasks import BUILTIN_GRADERS, PairedResult, load_tasks, run_paired
from ..contracts import Evaluator
from ..hookspecs import hookimpl
from ..types import ActiveRelease, Candidate, Decision, Evaluation


class AlwaysEvaluator(Evaluator):
    """Selects every candidate (record the decision, measure nothing)."""

    timeout_s = 60.0

    def evaluate(self, candidate: Candidate, current: ActiveRelease | None, ctx: Any) -> Evaluation:
        return Evaluation(evaluator="always")

    def decide(self, evaluation: Evaluation) -> Decision:
        return Decision("select", "evaluator 'always' selects every candidate")


class TaskSuiteEvaluator(Evaluator):
    """Paired comparison on held-out tasks: selects when wins − losses > ``margin``.

    Options: ``tasks`` (list or JSONL path), ``grader`` (default for tasks naming none),
    ``margin``, ``repeats``, ``model`` (default: the runtime's configured model),
    ``params`` (extra request fields, e.g. ``temperature``), ``episode_timeout_s``,
    ``timeout_s`` (the whole evaluation), ``concurrency``.
    """

    name = "task_suite"

    def __init__(self, tasks: list[dict[str, Any]] | str, grader: str = "contains", margin: int = 0,
                 repeats: int = 1, model: str | None = None, params: dict[str, Any] | None = None,
                 episode_timeout_s: float = 120.0, timeout_s: float = 1800.0, concurrency: int = 4,
                 plugins: Any = None):
        if repeats < 1:
            raise ValueError("repeats must be 1 or more")
        if episode_timeout_s <= 0 or timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        self.graders = dict(BUILTIN_GRADERS)
        if plugins is not None:
            self.graders.update({n: r.obj for n, r in plugins.registry.get("grader", {}).items()})
        self.tasks = load_tasks(tasks, grader, self.graders)
        self.margin = margin
        self.repeats = repeats
        self.model = model
        self.params = dict(params or {})
        self.episode_timeout_s = float(episode_timeout_s)
        self.timeout_s = float(timeout_s)
        self.concurrency = concurrency

    def evaluate(self, candidate: Candidate, current: ActiveRelease | None, ctx: Any) -> Evaluation:
        side = ActiveRelease(scenario=candidate.scenario, release_id=f"candidate:{candidate.id}",
                             path=candidate.artifact_dir)
        result = run_paired(self.tasks, side, current, ctx, self.graders,
                            model=self.model or ctx.default_model or "default", params=self.params,
                            repeats=self.repeats, episode_timeout_s=self.episode_timeout_s,
                            concurrency=self.concurrency)
        metrics: dict[str, Any] = {
            **result.compare(),
            "margin": self.margin,
            "candidate_mean": PairedResult.mean(result.candidate),
            "current_mean": PairedResult.mean(result.current),
            "candidate_crashed": sum(s is None for s in result.candidate),
            "current_crashed": sum(s is None for s in result.current),
        }
        if result.errors:
            metrics["episode_errors"] = result.errors[:10]
        return Evaluation(evaluator=self.name, candidate_scores=result.candidate,
                          current_scores=result.current, tasks=result.tasks, metrics=metrics)

    def decide(self, evaluation: Evaluation) -> Decision:
        m = evaluation.metrics
        diff = m["wins"] - m["losses"]
        verdict = "select" if diff > self.margin else "reject"
        return Decision(verdict, f"wins {m['wins']} − losses {m['losses']} = {diff}, "
                                 f"{'above' if verdict == 'select' else 'not above'} margin {self.margin}")


class ThresholdEvaluator(TaskSuiteEvaluator):
    """Selects when the candidate's mean score ≥ the current's mean + ``delta`` (crashed = 0)."""

    name = "threshold"

    def __init__(self, tasks: list[dict[str, Any]] | str, delta: float = 0.0, grader: str = "contains",
                 repeats: int = 1, model: str | None = None, params: dict[str, Any] | None = None,
                 episode_timeout_s: float = 120.0, timeout_s: float = 1800.0, concurrency: int = 4,
                 plugins: Any = None):
        super().__init__(tasks, grader=grader, repeats=repeats, model=model, params=params,
                         episode_timeout_s=episode_timeout_s, timeout_s=timeout_s,
                         concurrency=concurrency, plugins=plugins)
        self.delta = delta

    def decide(self, evaluation: Evaluation) -> Decision:
        m = evaluation.metrics
        if m["candidate_crashed"] == len(evaluation.candidate_scores):
            return Decision("reject", "every candidate episode crashed")
        need = m["current_mean"] + self.delta
        ok = m["candidate_mean"] >= need
        return Decision("select" if ok else "reject",
                        f"candidate mean {m['candidate_mean']:.3f} {'≥' if ok else '<'} "
                        f"current mean {m['current_mean']:.3f} + delta {self.delta:g}")


@hookimpl
def register_evaluators(register: Any) -> None:
    register("always", AlwaysEvaluator)
    register("task_suite", TaskSuiteEvaluator)
    register("threshold", ThresholdEvaluator)


@hookimpl
def register_graders(register: Any) -> None:
    for name, fn in BUILTIN_GRADERS.items():
        register(name, fn)
