"""The standard evaluators (``always``, ``task_suite``, ``threshold``) and graders.

``task_suite`` and ``threshold`` run the same held-out tasks through the scenario's runtime
with the candidate's harness and with the current release's, paired task by task, at the
scenario's serving sampling parameters; they differ only in how they decide
(``reef_core.commit.stats``). ``task_suite`` under ``bootstrap`` or ``sign`` runs the suite in
rounds until the evidence decides or a cap is reached (``reef_core.commit.sequential``: select,
reject, or undecided). Evaluation is fail-closed by the gate (``reef_core.commit.gate``): any
exception or timeout rejects the candidate.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from ..commit.sequential import (
    AUTO_ROUNDS,
    SEQUENTIAL_RULES,
    SPENDING,
    Sensitivity,
    assumed_spread,
    gather,
    look_outcome,
    look_reason,
    never_selects,
    observed_spread,
    selection_problem,
)
from ..commit.stats import RULES, PairedStats, decide, seed_for
from ..commit.tasks import (
    AUTO_REPEATS,
    BUILTIN_GRADERS,
    SIDES,
    PairedResult,
    auto_repeats,
    contaminated_tasks,
    episode_params,
    load_tasks,
    run_paired,
    serving_conditions,
    training_prompts,
)
from ..commit.traffic import traffic_tasks
from ..contracts import Evaluator, refuse_bad_options
from ..errors import ConfigError
from ..hookspecs import hookimpl
from ..kit.graders import graders_of
from ..types import ActiveRelease, Candidate, Decision, Evaluation, Outcome

#: another round starts only when this many times the last round's duration is left before the
#: gate's deadline (a round cut short by the deadline would make the whole evaluation an error)
ROUND_HEADROOM = 1.25


class AlwaysEvaluator(Evaluator):
    """Selects every candidate (record the decision, measure nothing)."""

    timeout_s = 60.0

    def evaluate(self, candidate: Candidate, current: ActiveRelease | None, ctx: Any) -> Evaluation:
        return Evaluation(evaluator="always")

    def decide(self, evaluation: Evaluation) -> Decision:
        return Decision("select", "evaluator 'always' selects every candidate")


class TaskSuiteEvaluator(Evaluator):
    """Paired comparison on held-out tasks at serving conditions, in rounds, decided by ``rule``.

    Options: ``tasks`` (list or JSONL path), ``grader`` (default for tasks naming none),
    ``rule`` (``bootstrap``, ``sign``, ``wins_minus_losses``), ``margin`` (score units; a
    count of tasks for ``wins_minus_losses``), ``confidence``, ``repeats`` (per round;
    ``auto``: 1 at temperature 0, else 5), ``max_episodes`` (the cap on episodes of both
    sides; ``auto``: four rounds at serving temperature, one greedily), ``model`` (default:
    the runtime's configured model), ``params`` (request fields over the serving ones, e.g.
    ``{temperature: 0}``), ``episode_timeout_s``, ``timeout_s`` (the whole evaluation),
    ``concurrency`` (episodes in flight), ``traffic_tasks`` (up to this many more tasks drawn
    from the scenario's scored traffic, ``reef_core.commit.traffic``; 0, the default: none).

    Under ``bootstrap`` and ``sign`` the suite runs in rounds and stops at the first look
    whose interval lies above ``margin`` (select) or at or below it (reject); at the cap the
    candidate is undecided (``reef_core.commit.sequential``).
    """

    name = "task_suite"

    def __init__(self, tasks: list[dict[str, Any]] | str, grader: str = "contains", margin: float = 0.0,
                 repeats: int | Literal["auto"] = "auto", model: str | None = None,
                 params: dict[str, Any] | None = None, episode_timeout_s: float = 120.0,
                 timeout_s: float = 1800.0, concurrency: int = 8,
                 rule: Literal["bootstrap", "sign", "wins_minus_losses"] = "bootstrap", confidence: float = 0.95,
                 max_episodes: int | Literal["auto"] = "auto", traffic_tasks: int = 0, plugins: Any = None):
        refuse_bad_options(TaskSuiteEvaluator, locals())
        self.graders = dict(BUILTIN_GRADERS)
        if plugins is not None:
            self.graders.update({n: r.obj for n, r in plugins.registry.get("grader", {}).items()})
        # with traffic tasks the configured ones may be none: the scenario's traffic is the suite
        self.tasks = load_tasks(tasks, grader, self.graders) if tasks or not traffic_tasks else []
        self.traffic_tasks = traffic_tasks
        self.margin = margin
        self.repeats = repeats
        self.max_episodes = max_episodes
        self.model = model
        self.params = dict(params or {})
        self.episode_timeout_s = float(episode_timeout_s)
        self.timeout_s = float(timeout_s)
        self.concurrency = concurrency
        self.rule = rule
        self.confidence = float(confidence)

    @classmethod
    def option_problems(cls, o: dict[str, Any]) -> list[str]:
        """Every problem of the option values, before the suite is built (``reef config`` asks).

        The task file itself is read when the evaluator is built. ``threshold`` takes neither
        ``rule``, ``max_episodes`` nor ``traffic_tasks``, so those are checked where given."""
        problems = []
        repeats = o["repeats"]
        if repeats != "auto" and (not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1):
            problems.append("repeats must be 1 or more, or 'auto'")
        max_episodes = o.get("max_episodes", "auto")
        if max_episodes != "auto" and (not isinstance(max_episodes, int) or isinstance(max_episodes, bool)
                                       or max_episodes < 1):
            problems.append("max_episodes must be 1 or more, or 'auto'")
        if o["episode_timeout_s"] <= 0 or o["timeout_s"] <= 0:
            problems.append("timeouts must be positive")
        if "rule" in o and o["rule"] not in RULES:
            problems.append(f"rule must be one of {', '.join(RULES)}")
        if not 0.0 < o["confidence"] < 1.0:
            problems.append("confidence must be between 0 and 1, e.g. 0.95")
        if o["concurrency"] < 1:
            problems.append("concurrency must be 1 or more")
        traffic = o.get("traffic_tasks", 0)
        if not isinstance(traffic, int) or isinstance(traffic, bool) or traffic < 0:
            problems.append("traffic_tasks must be 0 or more")
        elif o.get("tasks") or not traffic:
            # the tasks as the build reads them (a file, each task's grader and pattern): what
            # `reef serve` would refuse, `reef config` refuses
            from ..plugins import get_plugins

            try:
                load_tasks(o.get("tasks") or [], o.get("grader", "contains"), graders_of(get_plugins()))
            except ConfigError as exc:
                problems.append(str(exc) + ("" if o.get("tasks") else " or traffic_tasks above 0"))
        return problems

    # ------------------------------------------------------------------ the design

    @property
    def alpha(self) -> float:
        """The one-sided error rate of the whole evaluation: an equal candidate selected."""
        return (1.0 - self.confidence) / 2.0

    @property
    def sequential(self) -> bool:
        return self.rule in SEQUENTIAL_RULES

    def planned_rounds(self, n_tasks: int, repeats: int, greedy: bool) -> int:
        """Rounds the cap allows: one for a rule that knows no noise; ``auto``: ``AUTO_ROUNDS``
        at serving temperature and one greedily (a deterministic runtime answers a second round
        as the first); else as many whole rounds as ``max_episodes`` holds, at least one."""
        if not self.sequential:
            return 1
        if self.max_episodes == "auto":
            return 1 if greedy else AUTO_ROUNDS
        return max(int(self.max_episodes) // (len(SIDES) * n_tasks * repeats), 1)

    def sensitivity_margin(self) -> float:
        """The margin in score units (``wins_minus_losses`` counts tasks: 0 stands in)."""
        return float(self.margin) if self.rule != "wins_minus_losses" else 0.0

    @property
    def planned_tasks(self) -> int:
        """Tasks an evaluation runs at most: the configured ones and the traffic tasks asked for
        (fewer when the scenario's traffic holds fewer)."""
        return len(self.tasks) + self.traffic_tasks

    def _planned(self) -> tuple[bool, int, int]:
        """(greedy, repeats a round, rounds) before anything is known of serving: sampled unless
        ``params`` sets temperature 0."""
        greedy = _greedy(self.params)
        repeats = (1 if greedy else AUTO_REPEATS) if self.repeats == "auto" else int(self.repeats)
        return greedy, repeats, self.planned_rounds(self.planned_tasks, repeats, greedy)

    def sensitivity(self) -> Sensitivity:
        """What this suite detects before anything is measured (``_planned``), with the spread
        of a 0/1 grader at p = 0.5."""
        greedy, repeats, rounds = self._planned()
        return Sensitivity.of(self.planned_tasks, assumed_spread(greedy), repeats=repeats, rounds=rounds,
                              alpha=self.alpha, margin=self.sensitivity_margin(), rule=self._power_rule())

    def selection_problem(self) -> str | None:
        """Why this suite can never select (or only when every task improves alike), or None."""
        _, _, rounds = self._planned()
        return selection_problem(self.planned_tasks, self.rule, self.margin, self.alpha, rounds)

    def _power_rule(self) -> str:
        return "sign" if self.rule == "sign" else "bootstrap"

    # ------------------------------------------------------------------ evaluate and decide

    def evaluate(self, candidate: Candidate, current: ActiveRelease | None, ctx: Any) -> Evaluation:
        serving = serving_conditions(ctx)
        params = episode_params(serving, self.params)
        repeats = auto_repeats(params, serving) if self.repeats == "auto" else int(self.repeats)
        trained_on = training_prompts(ctx, candidate)
        drawn = traffic_tasks(getattr(ctx, "store", None), candidate.scenario, self.traffic_tasks,
                              graders=self.graders, exclude_reports=candidate.report_ids,
                              exclude_records=candidate.record_ids, training_prompts=trained_on,
                              seed=seed_for(candidate.id))
        tasks = [*self.tasks, *drawn]
        if not tasks:
            raise ValueError("no gate task: the configured tasks are none and the scenario's scored traffic "
                             "holds no report a grader can score (metadata pattern or expected) outside the "
                             "candidate's batch")
        greedy = _greedy(params)
        rounds = self.planned_rounds(len(tasks), repeats, greedy)
        if self.traffic_tasks and never_selects(len(tasks), self.rule, self.margin, self.alpha, rounds):
            # the traffic held too few tasks for this gate ever to select: spend no episode on it
            # (fail-closed; the batch returns to the pool and a later draw may find more)
            raise ValueError(f"{len(drawn)} gate task(s) from the scenario's graded traffic and {len(self.tasks)} "
                             f"configured: {selection_problem(len(tasks), self.rule, self.margin, self.alpha, rounds)}")
        side = ActiveRelease(scenario=candidate.scenario, release_id=f"candidate:{candidate.id}",
                             path=candidate.artifact_dir)
        done: list[PairedResult] = []
        round_s = [0.0]

        def play_round(k: int) -> tuple[list[list[float | None]], list[list[float | None]]]:
            began = time.monotonic()
            result = run_paired(tasks, side, current, ctx, self.graders,
                                model=self.model or ctx.default_model or "default", params=params,
                                repeats=repeats, episode_timeout_s=self.episode_timeout_s,
                                concurrency=self.concurrency, first_repeat=k * repeats,
                                label=f" (round {k + 1} of up to {rounds})" if rounds > 1 else "")
            done.append(result)
            round_s[0] = time.monotonic() - began
            return result.by_task(result.candidate), result.by_task(result.current)

        def stop() -> str:
            if all(s is None for r in done for s in r.candidate):
                return "crashed"
            return _no_time_for_a_round(ctx, round_s[0])

        gathered = gather(play_round, rounds=rounds, rule=self.rule, margin=self.margin,
                          confidence=self.confidence, seed=seed_for(candidate.id), stop=stop)
        result, stats = PairedResult.combine(done), gathered.stats
        spread = observed_spread(gathered.candidate, gathered.current) or assumed_spread(greedy)
        sensitivity = Sensitivity.of(len(tasks), spread, repeats=repeats, rounds=gathered.rounds, alpha=self.alpha,
                                     margin=self.sensitivity_margin(), rule=self._power_rule())
        metrics: dict[str, Any] = {
            **self.rule_metrics(),
            **stats.to_metrics(),
            "episodes": len(result.episodes),
            "candidate_crashed": sum(s is None for s in result.candidate),
            "current_crashed": sum(s is None for s in result.current),
            "temperature": params.get("temperature"),
            "params": params,
            "serving": serving.to_dict(),
            "contaminated_tasks": contaminated_tasks(tasks, trained_on),
            "traffic_tasks": [t["id"] for t in drawn],
            "alpha": self.alpha,
            "look_alpha": gathered.look_alpha,
            "rounds": gathered.rounds_run,
            "max_rounds": gathered.rounds,
            "max_episodes": gathered.rounds * len(SIDES) * len(tasks) * repeats,
            "spending": SPENDING if self.sequential else None,
            "stopped": gathered.stopped,
            "looks": gathered.looks,
            **sensitivity.to_metrics(),
        }
        if result.errors:
            metrics["episode_errors"] = result.errors[:10]
        return Evaluation(evaluator=self.name, candidate_scores=result.candidate,
                          current_scores=result.current, tasks=result.tasks, metrics=metrics,
                          episodes=result.episodes)

    def decide(self, evaluation: Evaluation) -> Decision:
        m = evaluation.metrics
        note = _sensitivity_note(m) + _contamination_note(m)
        if evaluation.candidate_scores and m["candidate_crashed"] == len(evaluation.candidate_scores):
            return Decision("reject", f"every candidate episode crashed ({m['candidate_crashed']})" + note)
        outcome, reason = self.verdict(PairedStats.from_metrics(m), m)
        return Decision(outcome, reason + note)

    def rule_metrics(self) -> dict[str, Any]:
        return {"rule": self.rule, "margin": self.margin}

    def verdict(self, stats: PairedStats, metrics: dict[str, Any]) -> tuple[Outcome, str]:
        """The outcome of the evaluation's last look and its reason."""
        if self.sequential:
            outcome = look_outcome(stats, self.rule, self.margin, metrics["look_alpha"]) or "undecided"
            return outcome, look_reason(stats, self.rule, self.margin, outcome, round_=metrics["rounds"],
                                        rounds=metrics["max_rounds"], stopped=metrics.get("stopped", ""))
        ok, reason = decide(stats, self.rule, self.margin)
        return ("select" if ok else "reject"), reason


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

    def sensitivity_margin(self) -> float:
        return float(self.delta)

    def verdict(self, stats: PairedStats, metrics: dict[str, Any]) -> tuple[Outcome, str]:
        need = stats.current_mean + self.delta
        ok = stats.candidate_mean >= need
        return ("select" if ok else "reject"), (
            f"candidate mean {stats.candidate_mean:.3f} {'≥' if ok else '<'} "
            f"current mean {stats.current_mean:.3f} + delta {self.delta:g} (mean improvement "
            f"{stats.improvement:+.3f}, {stats.confidence * 100:g}% interval [{stats.low:+.3f}, "
            f"{stats.high:+.3f}] over {stats.n_tasks} task(s) × {stats.repeats} repeat(s))")


def _greedy(params: dict[str, Any]) -> bool:
    temperature = params.get("temperature")
    return temperature is not None and float(temperature) == 0.0


def _no_time_for_a_round(ctx: Any, round_s: float) -> str:
    """Why another round should not start (``cancelled``; ``time``: it would likely run past
    the gate's deadline, which would turn the evaluation into an error), or ''."""
    cancelled = getattr(ctx, "cancelled", None)
    if cancelled is not None and cancelled.is_set():
        return "cancelled"
    deadline = getattr(ctx, "deadline", None)
    if deadline is not None and time.monotonic() + ROUND_HEADROOM * round_s > deadline:
        return "time"
    return ""


def _sensitivity_note(metrics: dict[str, Any]) -> str:
    sensitivity = Sensitivity.from_metrics(metrics)
    return f"; {sensitivity.sentence()}" if sensitivity is not None else ""


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
