"""Evaluators and the gate in isolation: paired scoring, crash ranking, margins, thresholds,
graders (built-in and plugin), task loading, fail-closed timeouts and exceptions."""

from __future__ import annotations

import asyncio
import json
import logging
import threading

import pytest

from reef_core.builtins.evaluators import (
    AlwaysEvaluator,
    TaskSuiteEvaluator,
    ThresholdEvaluator,
)
from reef_core.commit.gate import EvalContext, run_gate
from reef_core.commit.tasks import BUILTIN_GRADERS, PairedResult, load_tasks, task_body
from reef_core.errors import ConfigError, RuntimeCallError
from reef_core.grow.progress import LogProgress
from reef_core.plugins import get_plugins, instantiate
from reef_core.types import Candidate

from .conftest import add_plugin


class ScriptedRuntime:
    """Answers by side: the candidate's harness shows up as a system message."""

    dialect = "openai"

    def __init__(self, answers):
        self.answers = answers  # (side, prompt) -> answer | Exception | "hang"
        self.calls = 0

    async def complete(self, call):
        self.calls += 1
        side = "candidate" if call.release and call.release.release_id.startswith("candidate:") else "current"
        prompt = call.body["messages"][-1]["content"]
        answer = self.answers.get((side, prompt), "")
        if isinstance(answer, Exception):
            raise answer
        if answer == "hang":
            await asyncio.sleep(30)
        return {"choices": [{"message": {"role": "assistant", "content": answer}}]}


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _ctx(loop, runtime):
    return EvalContext(scenario="s", runtime=runtime, loop=loop, apply_harness=None,
                       log=logging.getLogger("t"), progress=LogProgress(logging.getLogger("t")), default_model="m")


def _candidate(tmp_path):
    return Candidate(scenario="s", recipe="r", artifact_dir=tmp_path, id="cand_1")


TASKS = [{"id": "a", "prompt": "A?", "expected": "yes"}, {"id": "b", "prompt": "B?", "expected": "yes"},
         {"id": "c", "prompt": "C?", "expected": "yes"}]


def test_paired_comparison_counts_wins_losses_and_crashes(loop, tmp_path):
    runtime = ScriptedRuntime({
        ("candidate", "A?"): "yes", ("current", "A?"): "no",                        # win
        ("candidate", "B?"): RuntimeCallError("boom"), ("current", "B?"): "no",     # crashed < 0.0: loss
        ("candidate", "C?"): RuntimeCallError("x"), ("current", "C?"): RuntimeCallError("y"),  # tie
    })
    suite = TaskSuiteEvaluator(tasks=TASKS, margin=0, rule="wins_minus_losses")
    evaluation, decision = run_gate(suite, "task_suite", _candidate(tmp_path), None, _ctx(loop, runtime), 30)
    assert evaluation.candidate_scores == [1.0, None, None] and evaluation.current_scores == [0.0, 0.0, None]
    m = evaluation.metrics
    assert (m["wins"], m["losses"], m["ties"]) == (1, 1, 1)
    assert m["candidate_crashed"] == 2 and m["current_crashed"] == 1
    assert any("RuntimeCallError: boom" in e for e in m["episode_errors"])
    assert decision.outcome == "reject" and "= 0, not above margin 0" in decision.reason


def test_margin_and_repeats(loop, tmp_path):
    answers = {("candidate", p): "yes" for p in ("A?", "B?", "C?")}
    runtime = ScriptedRuntime(answers)
    ctx = _ctx(loop, runtime)
    counted = {"rule": "wins_minus_losses"}
    assert run_gate(TaskSuiteEvaluator(tasks=TASKS, margin=2, **counted), "t", _candidate(tmp_path), None, ctx,
                    30)[1].outcome == "select"
    evaluation, decision = run_gate(TaskSuiteEvaluator(tasks=TASKS, margin=3, **counted), "t", _candidate(tmp_path), None,
                                    _ctx(loop, runtime), 30)
    assert decision.outcome == "reject"
    evaluation, _ = run_gate(TaskSuiteEvaluator(tasks=TASKS, repeats=2), "t", _candidate(tmp_path), None,
                             _ctx(loop, runtime), 30)
    assert evaluation.tasks == ["a", "a", "b", "b", "c", "c"] and len(evaluation.candidate_scores) == 6


def test_threshold_decides_on_means(loop, tmp_path):
    runtime = ScriptedRuntime({("candidate", "A?"): "yes", ("candidate", "B?"): "yes",
                               ("current", "A?"): "yes", ("current", "B?"): "yes", ("current", "C?"): "yes"})
    _, decision = run_gate(ThresholdEvaluator(tasks=TASKS, delta=0.0), "threshold", _candidate(tmp_path), None,
                            _ctx(loop, runtime), 30)
    assert decision.outcome == "reject" and "0.667 < current mean 1.000" in decision.reason
    runtime.answers[("candidate", "C?")] = "yes"
    assert run_gate(ThresholdEvaluator(tasks=TASKS, delta=0.0), "threshold", _candidate(tmp_path), None,
                    _ctx(loop, runtime), 30)[1].outcome == "select"
    assert run_gate(ThresholdEvaluator(tasks=TASKS, delta=0.1), "threshold", _candidate(tmp_path), None,
                    _ctx(loop, runtime), 30)[1].outcome == "reject"


def test_episode_timeouts_crash_only_that_episode(loop, tmp_path):
    runtime = ScriptedRuntime({("candidate", "A?"): "hang", ("current", "A?"): "yes"})
    suite = TaskSuiteEvaluator(tasks=TASKS[:1], episode_timeout_s=0.2)
    evaluation, decision = run_gate(suite, "t", _candidate(tmp_path), None, _ctx(loop, runtime), 30)
    assert evaluation.candidate_scores == [None] and evaluation.current_scores == [1.0]
    assert "TimeoutError" in evaluation.metrics["episode_errors"][0]
    assert decision.outcome == "reject"


def test_gate_timeout_rejects_and_stops_further_model_calls(loop, tmp_path):
    runtime = ScriptedRuntime({("candidate", "A?"): "hang", ("current", "A?"): "hang"})
    suite = TaskSuiteEvaluator(tasks=TASKS, concurrency=1)
    ctx = _ctx(loop, runtime)
    evaluation, decision = run_gate(suite, "task_suite", _candidate(tmp_path), None, ctx, 0.3)
    assert decision.outcome == "error" and "timed out after 0.3s" in decision.reason
    assert evaluation.error == decision.reason
    assert ctx.cancelled.is_set()


def test_an_evaluation_reporting_an_error_never_selects(loop, tmp_path):
    class Sneaky(AlwaysEvaluator):
        def evaluate(self, candidate, current, ctx):
            ev = super().evaluate(candidate, current, ctx)
            ev.error = "half the judges were down"
            return ev

    _, decision = run_gate(Sneaky(), "sneaky", _candidate(tmp_path), None,
                                    _ctx(loop, ScriptedRuntime({})), 5)
    assert decision.outcome == "error" and "half the judges" in decision.reason


def test_graders_builtin_and_registered(loop, tmp_path):
    assert BUILTIN_GRADERS["exact"](" Paris \n", {"expected": "Paris"}) == 1.0
    assert BUILTIN_GRADERS["exact"]("Paris.", {"expected": "Paris"}) == 0.0
    assert BUILTIN_GRADERS["contains"]("It is PARIS.", {"expected": "paris"}) == 1.0
    assert BUILTIN_GRADERS["regex"]("answer: 42", {"pattern": r"\b42\b"}) == 1.0
    assert BUILTIN_GRADERS["regex"]("answer: 42", {"expected": r"^4"}) == 0.0

    add_plugin("grader", "length", lambda output, task: min(len(output) / task["target"], 1.0))
    suite = instantiate("evaluator", "task_suite",
                        {"tasks": [{"prompt": "A?", "grader": "length", "target": 10}]}, get_plugins())
    runtime = ScriptedRuntime({("candidate", "A?"): "0123456789", ("current", "A?"): "01234"})
    evaluation, decision = run_gate(suite, "task_suite", _candidate(tmp_path), None, _ctx(loop, runtime), 30)
    assert evaluation.candidate_scores == [1.0] and evaluation.current_scores == [0.5]
    assert decision.outcome == "select"


def test_tasks_from_jsonl_and_clear_errors(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"prompt": "A?", "expected": "x"}) + "\n\n"
                    + json.dumps({"messages": [{"role": "user", "content": "B?"}], "pattern": "b+"}) + "\n")
    tasks = load_tasks(str(path), "contains", BUILTIN_GRADERS)
    assert [(t["id"], t["grader"]) for t in tasks] == [("task-1", "contains"), ("task-2", "regex")]
    cases = [
        ([], "at least one task"),
        ([{"expected": "x"}], "needs 'prompt' or 'messages'"),
        ([{"prompt": "A?"}], "needs 'expected'"),
        ([{"prompt": "A?", "expected": "x", "grader": "vibes"}], "unknown grader 'vibes'"),
        ([{"prompt": "A?", "pattern": "("}], "invalid pattern"),
        (str(tmp_path / "missing.jsonl"), "cannot read evaluation tasks file"),
    ]
    for spec, message in cases:
        with pytest.raises(ConfigError, match=message):
            load_tasks(spec, "contains", BUILTIN_GRADERS)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    with pytest.raises(ConfigError, match="bad.jsonl:1: not a JSON object"):
        load_tasks(str(bad), "contains", BUILTIN_GRADERS)


def test_task_bodies_per_dialect():
    task = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], "system": "T"}
    anthropic = task_body(task, "anthropic", "m", {"temperature": 0})
    assert anthropic["system"] == "T\n\nS" and anthropic["messages"] == [{"role": "user", "content": "U"}]
    assert anthropic["max_tokens"] == 1024 and anthropic["temperature"] == 0
    openai = task_body({"prompt": "U", "system": "T"}, "openai", "m", {})
    assert openai["messages"] == [{"role": "system", "content": "T"}, {"role": "user", "content": "U"}]
    assert PairedResult.mean([1.0, None, 0.0, 1.0]) == 0.5


SPLIT = {("candidate", "A?"): "yes", ("current", "A?"): "no",   # a win
         ("candidate", "B?"): "no", ("current", "B?"): "yes",   # a loss
         ("candidate", "C?"): "yes", ("current", "C?"): "yes"}  # a tie


def test_rounds_gather_evidence_until_the_cap_then_the_candidate_is_undecided(loop, tmp_path):
    runtime = ScriptedRuntime(SPLIT)
    suite = TaskSuiteEvaluator(tasks=TASKS, repeats=1, max_episodes=12, concurrency=1)  # 2 rounds of 3 × 2
    evaluation, decision = run_gate(suite, "task_suite", _candidate(tmp_path), None, _ctx(loop, runtime), 30)
    m = evaluation.metrics
    assert (m["rounds"], m["max_rounds"], m["max_episodes"], m["episodes"]) == (2, 2, 12, 12)
    assert runtime.calls == 12 and m["repeats"] == 2 and m["stopped"] == "cap"
    assert [e.repeat for e in evaluation.episodes if e.side == "candidate"] == [0, 1, 0, 1, 0, 1]
    assert evaluation.tasks == ["a", "a", "b", "b", "c", "c"]
    assert [look["outcome"] for look in m["looks"]] == ["continue", "undecided"]
    assert sum(look["alpha"] for look in m["looks"]) == pytest.approx(0.025) and m["look_alpha"] < 0.025
    assert decision.outcome == "undecided"
    assert "round 2 of up to 2" in decision.reason and "the cap (max_episodes) is reached; undecided" in decision.reason
    assert "with 3 task(s) × 1 repeat(s), up to 2 round(s), this gate" in decision.reason


def test_a_clear_winner_or_loser_decides_in_the_first_round(loop, tmp_path):
    winner = ScriptedRuntime({("candidate", p): "yes" for p in ("A?", "B?", "C?")})
    evaluation, decision = run_gate(TaskSuiteEvaluator(tasks=TASKS), "task_suite", _candidate(tmp_path), None,
                                    _ctx(loop, winner), 30)
    assert decision.outcome == "select" and evaluation.metrics["rounds"] == 1 and winner.calls == 6
    assert evaluation.metrics["max_rounds"] == 4 and "round 1 of up to 4" in decision.reason
    loser = ScriptedRuntime({("current", p): "yes" for p in ("A?", "B?", "C?")})
    evaluation, decision = run_gate(TaskSuiteEvaluator(tasks=TASKS), "task_suite", _candidate(tmp_path), None,
                                    _ctx(loop, loser), 30)
    assert decision.outcome == "reject" and evaluation.metrics["rounds"] == 1
    assert "the upper bound is not above margin 0, so the candidate is no better" in decision.reason


def test_greedy_auto_plays_one_round_and_rules_without_noise_one_look(loop, tmp_path):
    ctx = _ctx(loop, ScriptedRuntime(SPLIT))
    evaluation, decision = run_gate(TaskSuiteEvaluator(tasks=TASKS, params={"temperature": 0}), "task_suite",
                                    _candidate(tmp_path), None, ctx, 30)
    assert evaluation.metrics["max_rounds"] == 1 and decision.outcome == "undecided"
    assert "round" not in decision.reason and "with 3 task(s) × 1 repeat(s) this gate cannot detect" in decision.reason
    counted = TaskSuiteEvaluator(tasks=TASKS, rule="wins_minus_losses", max_episodes=600)
    evaluation, decision = run_gate(counted, "task_suite", _candidate(tmp_path), None,
                                    _ctx(loop, ScriptedRuntime(SPLIT)), 30)
    assert evaluation.metrics["max_rounds"] == 1 and decision.outcome == "reject"


def test_no_round_starts_that_the_gate_timeout_would_cut_short(loop, tmp_path):
    class Slow(ScriptedRuntime):
        async def complete(self, call):
            await asyncio.sleep(0.1)
            return await super().complete(call)

    runtime = Slow(SPLIT)
    suite = TaskSuiteEvaluator(tasks=TASKS, repeats=1, concurrency=1)  # a round: 6 episodes, about 0.6 s
    evaluation, decision = run_gate(suite, "task_suite", _candidate(tmp_path), None, _ctx(loop, runtime), 1.2)
    m = evaluation.metrics
    assert decision.outcome == "undecided" and evaluation.error is None  # not an error: it stopped in time
    assert m["rounds"] == 1 and m["max_rounds"] == 4 and m["stopped"] == "time" and runtime.calls == 6
    assert "the evaluation's timeout leaves no time for another round; undecided" in decision.reason


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "many"])
def test_max_episodes_is_checked(value):
    with pytest.raises(ValueError, match="max_episodes must be 1 or more, or 'auto'"):
        TaskSuiteEvaluator(tasks=TASKS, max_episodes=value)
