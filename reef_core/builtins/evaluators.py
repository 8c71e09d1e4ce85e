"""The standard evaluators (``always``, ``task_suite``, ``threshold``) and graders.

``task_suite`` and ``threshold`` run the same held-out tasks through the scenario's runtime
with the candidate's harness and with the current release's, paired task by task, at the
scenario's serving sampling parameters; they differ only in how they decide
(``reef_core.commit.stats``). Evaluation is fail-closed by the gate
(``reef_core.commit.gate``): any exception or timeout rejects the candidate.
"""

from __future__ import annotations

from typing import Any, Literal

from ..commit.stats import RULES, PairedStats, decide, paired_stats, seed_for
from ..commit.tasks import (
    BUILTIN_GRADERS,
    auto_repeats,
    contaminated_tasks,
    episode_params,
    load_tasks,
    run_paired,
    serving_conditions,
    training_prompts,
)
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
    """Paired comparison on held-out tasks at serving conditions, decided by ``rule``.

    Options: ``tasks`` (list or JSONL path), ``grader`` (default for tasks naming none),
    ``rule`` (``bootstrap``, ``sign``, ``wins_minus_losses``), ``margin`` (score units; a
    count of tasks for ``wins_minus_losses``), ``confidence``, ``repeats`` (``auto``: 1 at
    temperature 0, else 5), ``model`` (default: the runtime's configured model), ``params``
    (request fields over the serving ones, e.g. ``{temperature: 0}``), ``episode_timeout_s``,
    ``timeout_s`` (the whole evaluation), ``concurrency`` (episodes in flight).
    """

    name = "task_suite"

    def __init__(self, tasks: list[dict[str, Any]] | str, grader: str = "contains", margin: float = 0.0,
                 repeats: int | Literal["auto"] = "auto", model: str | None = None,
                 params: dict[str, Any] | None = None, episode_timeout_s: float = 120.0,
                 timeout_s: float = 1800.0, concurrency: int = 8,
                 rule: Literal["bootstrap", "sign", "wins_minus_losses"] = "bootstrap", confidence: float = 0.95,
                 plugins: Any = None):
        if repeats != "auto" and (not isinstance(repeats, int) or repeats < 1):
            raise ValueError("repeats must be 1 or more, or 'auto'")
        if episode_timeout_s <= 0 or timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}")
        if not 0.0 < confidence < 1.0:
            raise ValueError("confidence must be between 0 and 1, e.g. 0.95")
        if concurrency < 1:
            raise ValueError("concurrency must be 1 or more")
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
        self.rule = rule
        self.confidence = float(confidence)

    def evaluate(self, candidate: Candidate, current: ActiveRelease | None, ctx: Any) -> Evaluation:
        serving = serving_conditions(ctx)
        params = episode_params(serving, self.params)
        repeats = auto_repeats(params, serving) if self.repeats == "auto" else int(self.repeats)
        side = ActiveRelease(scenario=candidate.scenario, release_id=f"candidate:{candidate.id}",
                             path=candidate.artifact_dir)
        result = run_paired(self.tasks, side, current, ctx, self.graders,
                            model=self.model or ctx.default_model or "default", params=params,
                            repeats=repeats, episode_timeout_s=self.episode_timeout_s,
                            concurrency=self.concurrency)
        stats = paired_stats(result.by_task(result.candidate), result.by_task(result.current),
                             confidence=self.confidence, sign_margin=self.margin if self.rule == "sign" else 0.0,
                             seed=seed_for(candidate.id))
        metrics: dict[str, Any] = {
            **self.rule_metrics(),
            **stats.to_metrics(),
            "episodes": len(result.episodes),
            "candidate_crashed": sum(s is None for s in result.candidate),
            "current_crashed": sum(s is None for s in result.current),
            "temperature": params.get("temperature"),
            "params": params,
            "serving": serving.to_dict(),
            "contaminated_tasks": contaminated_tasks(self.tasks, training_prompts(ctx, candidate)),
        }
        if result.errors:
            metrics["episode_errors"] = result.errors[:10]
        return Evaluation(evaluator=self.name, candidate_scores=result.candidate,
                          current_scores=result.current, tasks=result.tasks, metrics=metrics,
                          episodes=result.episodes)

    def decide(self, evaluation: Evaluation) -> Decision:
        m = evaluation.metrics
        if evaluation.candidate_scores and m["candidate_crashed"] == len(evaluation.candidate_scores):
            return Decision("reject", f"every candidate episode crashed ({m['candidate_crashed']})"
                                      + _contamination_note(m))
        ok, reason = self.verdict(PairedStats.from_metrics(m))
        return Decision("select" if ok else "reject", reason + _contamination_note(m))

    def rule_metrics(self) -> dict[str, Any]:
        return {"rule": self.rule, "margin": self.margin}

    def verdict(self, stats: PairedStats) -> tuple[bool, str]:
        return decide(stats, self.rule, self.margin)


class ThresholdEvaluator(TaskSuiteEvaluator):
    """Selects when the candidate's mean score ≥ the current's mean + ``delta`` (crashed = 0)."""

    name = "threshold"

    def __init__(self, tasks: list[dict[str, Any]] | str, delta: float = 0.0, grader: str = "contains",
                 repeats: int | Literal["auto"] = "auto", model: str | None = None,
                 params: dict[str, Any] | None = None, episode_timeout_s: float = 120.0,
                 timeout_s: float = 1800.0, concurrency: int = 8, confidence: float = 0.95,
                 plugins: Any = None):
        super().__init__(tasks, grader=grader, repeats=repeats, model=model, params=params,
                         episode_timeout_s=episode_timeout_s, timeout_s=timeout_s,
                         concurrency=concurrency, confidence=confidence, plugins=plugins)
        self.rule = "threshold"
        self.delta = delta

    def rule_metrics(self) -> dict[str, Any]:
        return {"rule": self.rule, "delta": self.delta}

    def verdict(self, stats: PairedStats) -> tuple[bool, str]:
        need = stats.current_mean + self.delta
        ok = stats.candidate_mean >= need
        return ok, (f"candidate mean {stats.candidate_mean:.3f} {'≥' if ok else '<'} "
                    f"current mean {stats.current_mean:.3f} + delta {self.delta:g} (mean improvement "
                    f"{stats.improvement:+.3f}, {stats.confidence * 100:g}% interval [{stats.low:+.3f}, "
                    f"{stats.high:+.3f}] over {stats.n_tasks} task(s) × {stats.repeats} repeat(s))")


def _contamination_note(metrics: dict[str, Any]) -> str:
    ids = metrics.get("contaminated_tasks") or []
    if not ids:
        return ""
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    return (f"; beware: {len(ids)} task(s) ({shown}) quote a prompt of the training batch, so they are "
            f"not held out")


@hookimpl
def register_evaluators(register: Any) -> None:
    register("always", AlwaysEvaluator)
    register("task_suite", TaskSuiteEvaluator)
    register("threshold", ThresholdEvaluator)


@hookimpl
def register_graders(register: Any) -> None:
    for name, fn in BUILTIN_GRADERS.items():
        register(name, fn)
