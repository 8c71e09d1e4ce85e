"""The gate at serving conditions: episodes sampled as the scenario serves, repeated, decided
by a paired statistic over tasks, stored in full, and flagged when a task was trained on."""

from __future__ import annotations

import asyncio
import math
import random
import threading
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from reef_core import hookimpl
from reef_core.builtins.evaluators import TaskSuiteEvaluator, ThresholdEvaluator
from reef_core.commit.gate import run_gate
from reef_core.commit.sequential import AUTO_ROUNDS, Sensitivity, look_outcome, look_reason, observed_spread
from reef_core.commit.stats import (
    PairedStats,
    bootstrap_interval,
    decide,
    expanded_z,
    paired_stats,
    seed_for,
    sign_test,
    student_t_cdf,
    student_t_quantile,
)
from reef_core.commit.tasks import (
    AUTO_REPEATS,
    ServingConditions,
    auto_repeats,
    contaminated_tasks,
    normalize_prompt,
    serving_params,
)
from reef_core.testing import EchoRuntime, FakeUpstream, ReefServer, eval_context, last_user_text, system_prompt
from reef_core.types import Candidate

from .conftest import GOOD_FEEDBACK, capital_model, feedback_rules_config, report, settings_for

CAPITALS = {"france": "Paris", "japan": "Tokyo", "spain": "Madrid", "germany": "Berlin", "egypt": "Cairo",
            "peru": "Lima", "kenya": "Nairobi", "norway": "Oslo", "chile": "Santiago", "canada": "Ottawa"}
TASKS = [{"id": c, "prompt": f"What is the capital of {c.title()}?", "expected": cap} for c, cap in CAPITALS.items()]
SERVING_TEMPERATURE = 0.9


class SampledCapitals:
    """A model whose harness matters greedily and, by ``p_ruled`` vs ``p_plain``, when sampled.

    At temperature 0 it names the capital exactly when the system prompt says to. Sampled,
    it names it with probability ``p_ruled`` (with that rule) or ``p_plain``. The n-th answer
    to the same (rule, question) is always the same draw, so each task's outcomes on each side
    do not depend on the order concurrent requests arrive in: the test is deterministic.
    """

    def __init__(self, p_ruled: float, p_plain: float, seed: str = "gate"):
        self.p = {True: p_ruled, False: p_plain}
        self.seed = seed
        self.seen: Counter = Counter()
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> str:
        ruled = "name the capital city" in system_prompt(body).lower()
        question = last_user_text(body).lower()
        country = next((c for c in CAPITALS if c in question), None)
        if country is None:
            return "I am not sure."
        if body.get("temperature", 1.0) == 0:
            correct = ruled
        else:
            with self.lock:
                n = self.seen[(ruled, country)]
                self.seen[(ruled, country)] += 1
            correct = random.Random(f"{self.seed}:{ruled}:{country}:{n}").random() < self.p[ruled]
        return f"The capital is {CAPITALS[country]}." if correct else "I am not sure."


class _Evaluations:
    """Keeps what the gate measured (with its episodes), as observers see it."""

    def __init__(self) -> None:
        self.seen: list[tuple[Candidate, Any, Any]] = []

    @hookimpl
    def candidate_evaluated(self, candidate, evaluation, decision):
        self.seen.append((candidate, evaluation, decision))


def _ask(client, question: str, temperature: float | None) -> str:
    body: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": question}]}
    if temperature is not None:
        body["temperature"] = temperature
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.headers["x-reef-agent-record-id"]


def _grow_once(tmp_path, responder, evaluator: dict[str, Any], *, tasks: list[dict[str, Any]] = TASKS,
               temperature: float | None = SERVING_TEMPERATURE) -> tuple[dict, Candidate, Any, Any]:
    """Serve a few requests at ``temperature``, report one with the good rule, grow once."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={
        "name": "task_suite", "tasks": tasks, "episode_timeout_s": 30, "timeout_s": 120, **evaluator})
    with FakeUpstream("openai", responder) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, config)) as server:
            seen = _Evaluations()
            server.reef.register(seen)
            client = server.client()
            for _ in range(3):
                _ask(client, "Hello there", temperature)
            receipt = _ask(client, "What is the capital of Italy?", temperature)
            report(client, [receipt], score=0.0, feedback=GOOD_FEEDBACK)
            r = client.post("/reef/scenarios/default/grow")
            assert r.status_code == 200, r.text
            [(candidate, evaluation, decision)] = seen.seen
            return r.json(), candidate, evaluation, decision


# --------------------------------------------------------------------------- through the server


def test_a_harness_better_only_greedily_is_not_published_at_serving_temperature(tmp_path):
    result, _, evaluation, _ = _grow_once(tmp_path / "new", SampledCapitals(0.5, 0.5), {})
    m = result["evaluation"]["metrics"]
    # equal when sampled: four rounds gather evidence, and the interval still holds 0 at the cap
    assert result["outcome"] == "undecided", result["reason"]
    assert m["serving"] == {"source": "records", "records": 4, "params": {"temperature": SERVING_TEMPERATURE}}
    assert m["temperature"] == SERVING_TEMPERATURE and m["rule"] == "bootstrap"
    assert m["rounds"] == m["max_rounds"] == AUTO_ROUNDS and m["repeats"] == AUTO_ROUNDS * AUTO_REPEATS
    assert m["episodes"] == m["max_episodes"] == 2 * len(TASKS) * AUTO_REPEATS * AUTO_ROUNDS
    assert m["interval"][0] <= 0.0 < m["interval"][1] and m["stopped"] == "cap"
    assert "the interval still holds margin 0 and the cap (max_episodes) is reached; undecided" in result["reason"]
    assert f"with {len(TASKS)} task(s) × {AUTO_REPEATS} repeat(s), up to {AUTO_ROUNDS} round(s), this gate " \
           f"detects +{m['detectable_effect']:.2f} or more (power 0.8, observed per-task sd" in result["reason"]
    assert all(e.request["temperature"] == SERVING_TEMPERATURE for e in evaluation.episodes)
    assert sorted({e.repeat for e in evaluation.episodes}) == list(range(AUTO_ROUNDS * AUTO_REPEATS))

    # the old gate: one greedy episode per task, wins − losses > 0, selects it
    old, _, _, _ = _grow_once(tmp_path / "old", SampledCapitals(0.5, 0.5),
                              {"repeats": 1, "rule": "wins_minus_losses", "params": {"temperature": 0}})
    assert old["outcome"] == "published", old["reason"]
    assert old["evaluation"]["metrics"]["wins"] == len(TASKS) and old["evaluation"]["metrics"]["repeats"] == 1
    assert old["reason"].startswith(f"wins {len(TASKS)} − losses 0 = {len(TASKS)}, above margin 0")


def test_a_truly_better_harness_is_selected_despite_sampling_noise(tmp_path):
    result, candidate, evaluation, decision = _grow_once(tmp_path, SampledCapitals(0.8, 0.4), {})
    m = result["evaluation"]["metrics"]
    assert result["outcome"] == "published", result["reason"]
    assert m["repeats"] == AUTO_REPEATS and m["n_tasks"] == len(TASKS) and m["episodes"] == 2 * len(TASKS) * 5
    assert m["interval"][0] > 0.0 and m["improvement"] > 0.2
    assert "paired bootstrap" in decision.reason and "is above margin 0" in decision.reason
    assert m["contaminated_tasks"] == []
    _check_episodes_match_the_decision(candidate, evaluation, decision)


def _check_episodes_match_the_decision(candidate, evaluation, decision) -> None:
    """The stored episodes recompute to the recorded metrics and the same decision."""
    episodes = evaluation.episodes
    m = evaluation.metrics
    ids = [t["id"] for t in TASKS]
    assert [(e.task_id, e.repeat, e.side) for e in episodes] == \
        [(t, r, s) for t in ids for r in range(m["repeats"]) for s in ("candidate", "current")]
    for e in episodes:
        assert e.request["temperature"] == SERVING_TEMPERATURE and e.grader == "contains" and e.error is None
        assert (GOOD_FEEDBACK in system_prompt(e.request)) == (e.side == "candidate")  # the harness as sent
        assert e.score == float(CAPITALS[e.task_id].lower() in e.answer.lower()) and e.latency_ms > 0
    assert evaluation.candidate_scores == [e.score for e in episodes if e.side == "candidate"]
    assert evaluation.current_scores == [e.score for e in episodes if e.side == "current"]
    by_task = {side: [[e.score for e in episodes if e.task_id == t and e.side == side] for t in ids]
               for side in ("candidate", "current")}
    stats = paired_stats(by_task["candidate"], by_task["current"], confidence=m["confidence"],
                         seed=seed_for(candidate.id))
    assert {k: m[k] for k in stats.to_metrics()} == stats.to_metrics()
    outcome = look_outcome(stats, m["rule"], m["margin"], m["look_alpha"]) or "undecided"
    reason = look_reason(stats, m["rule"], m["margin"], outcome, round_=m["rounds"], rounds=m["max_rounds"],
                         stopped=m["stopped"])
    per_round = m["repeats"] // m["rounds"]
    sensitivity = Sensitivity.of(len(ids), observed_spread(by_task["candidate"], by_task["current"]),
                                 repeats=per_round, rounds=m["max_rounds"], alpha=m["alpha"], margin=m["margin"])
    assert m["detectable_effect"] == round(sensitivity.effect, 4)
    assert (decision.outcome, decision.reason) == (outcome, f"{reason}; {sensitivity.sentence()}")


def test_a_task_the_candidate_trained_on_is_flagged(tmp_path):
    tasks = [*TASKS[:2], {"id": "italy", "prompt": "  what is the CAPITAL\nof italy? ", "expected": "Rome"}]
    result, _, _, decision = _grow_once(tmp_path, capital_model, {}, tasks=tasks, temperature=None)
    m = result["evaluation"]["metrics"]
    assert m["contaminated_tasks"] == ["italy"]
    assert "1 task(s) (italy) quote a prompt of the training batch, so they are not held out" in decision.reason
    # no temperature was sent: the runtime's default samples, so auto repeats
    assert m["serving"]["params"] == {} and m["temperature"] is None and m["repeats"] == AUTO_REPEATS


# --------------------------------------------------------------------------- statistics


def test_bootstrap_interval_contains_the_true_mean():
    rng = random.Random(7)
    diffs = [rng.gauss(0.3, 0.2) for _ in range(400)]
    low, high = bootstrap_interval(diffs, confidence=0.95, seed=1)
    assert low < 0.3 < high and low < sum(diffs) / len(diffs) < high
    assert 0.02 < high - low < 0.06  # about 2 × 1.96 × 0.2 / √400
    # coverage over many small samples of per-task differences: close to the nominal 95%
    covered = 0
    for k in range(200):
        data = [float(rng.random() < 0.7) - float(rng.random() < 0.4) for _ in range(30)]
        lo, hi = bootstrap_interval(data, confidence=0.95, resamples=500, seed=k)
        covered += lo <= 0.3 <= hi
    assert covered >= 180
    assert bootstrap_interval([0.5, 0.5, 0.5]) == (0.5, 0.5)
    assert bootstrap_interval([]) == (0.0, 0.0)


def test_bootstrap_is_deterministic_in_its_seed():
    diffs = [1.0, 0.0, -1.0, 0.4, 0.2, 0.0, 0.6]
    assert bootstrap_interval(diffs, seed=5) == bootstrap_interval(diffs, seed=5)
    assert bootstrap_interval(diffs, seed=5) != bootstrap_interval(diffs, seed=6)
    assert seed_for("cand_1") == seed_for("cand_1") != seed_for("cand_2")
    assert 0 <= seed_for("cand_1") < 2 ** 64
    assert paired_stats([[1.0], [0.0]], [[0.0], [0.0]], seed=3) == paired_stats([[1.0], [0.0]], [[0.0], [0.0]], seed=3)


def test_student_t_and_the_expanded_quantile():
    for df, p, table in [(1, 0.975, 12.7062), (2, 0.975, 4.3027), (3, 0.975, 3.1824), (5, 0.99, 3.3649),
                         (10, 0.975, 2.2281), (30, 0.995, 2.7500), (4, 0.9, 1.5332)]:
        assert student_t_quantile(p, df) == pytest.approx(table, abs=1e-4)
        assert student_t_cdf(student_t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)
    assert student_t_quantile(0.025, 7) == pytest.approx(-student_t_quantile(0.975, 7))
    # √(n/(n−1)) · t(n−1) approaches the normal quantile as tasks grow
    assert expanded_z(0.025, 4) > expanded_z(0.025, 24) > expanded_z(0.025, 1000) > 1.96
    assert expanded_z(0.025, 1000) == pytest.approx(1.96, abs=0.01)


def test_the_interval_is_not_too_narrow_at_small_error_rates():
    """At a look's small alpha, 2,000 resamples leave a handful beyond the percentile: the
    interval is at least the normal one with the resampled sd, so noise cannot narrow it."""
    rng = random.Random(3)
    diffs = [float(rng.random() < 0.5) - float(rng.random() < 0.5) for _ in range(24)]
    low, high = bootstrap_interval(diffs, confidence=1 - 2 * 0.004, seed=1)
    mean = sum(diffs) / 24
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 23)
    t_half = student_t_quantile(1 - 0.004, 23) * sd / math.sqrt(24)  # the t interval's half-width
    assert low <= mean - 0.95 * t_half and high >= mean + 0.95 * t_half


def test_sign_test_p_values():
    assert sign_test(9, 1) == pytest.approx(11 / 1024)
    assert sign_test(5, 0) == pytest.approx(1 / 32)
    assert sign_test(15, 5) == pytest.approx(0.020694732666015625)
    assert sign_test(10, 10) == pytest.approx(0.5880985260009766)
    assert sign_test(0, 4) == 1.0 and sign_test(0, 0) == 1.0
    assert sign_test(9, 1, alternative="two-sided") == pytest.approx(22 / 1024)
    assert sign_test(1, 9, alternative="two-sided") == pytest.approx(22 / 1024)
    assert sign_test(5, 5, alternative="two-sided") == 1.0
    with pytest.raises(ValueError):
        sign_test(1, 1, alternative="less")


def test_paired_stats_and_the_rules():
    # task 1: candidate 2/3 vs 1/3; task 2: candidate crashed once, equal means otherwise
    stats = paired_stats([[1.0, 1.0, 0.0], [None, 1.0, 1.0]], [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]], seed=0)
    assert stats.n_tasks == 2 and stats.repeats == 3
    assert stats.improvement == pytest.approx((1 / 3 + 0) / 2)
    assert (stats.wins, stats.losses, stats.ties) == (1, 1, 0)  # equal means: the crash loses
    assert (stats.above, stats.below) == (1, 0) and stats.p_value == 0.5
    assert PairedStats.from_metrics(stats.to_metrics()) == stats

    better = paired_stats([[1.0]] * 6, [[0.0]] * 6)
    assert decide(better, "sign", 0.0)[0]  # p = 1/64 ≤ 0.025
    five = paired_stats([[1.0]] * 5, [[0.0]] * 5)
    ok, reason = decide(five, "sign", 0.0)
    assert not ok and "p = 0.0312, not within 0.025 (95% confidence)" in reason
    assert decide(five, "bootstrap", 0.0) == (True, decide(five, "bootstrap", 0.0)[1])
    assert not decide(five, "bootstrap", 1.0)[0]  # the improvement is exactly 1: not above 1
    assert decide(five, "wins_minus_losses", 4)[0] and not decide(five, "wins_minus_losses", 5)[0]
    with pytest.raises(ValueError, match="unknown decision rule"):
        decide(five, "vibes", 0.0)


# --------------------------------------------------------------------------- serving conditions


def test_serving_params_are_what_most_recent_requests_used():
    def rec(route: str, **request: Any) -> SimpleNamespace:
        return SimpleNamespace(route=route, request={"messages": [], **request})

    records = [rec("openai.chat", temperature=0.7, top_p=0.9, max_completion_tokens=300),
               rec("openai.chat", temperature=0.7, top_k=40),
               rec("openai.chat", temperature=0.2, top_p=0.9),
               rec("anthropic.messages", temperature=1.0, top_k=5, max_tokens=300)]
    assert serving_params(records, "openai") == {"temperature": 0.7, "top_p": 0.9}
    # the same requests reaching an Anthropic runtime: only portable fields cross dialects
    assert serving_params(records, "anthropic") == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 300}
    assert serving_params([rec("openai.chat"), rec("openai.chat", temperature=0.0)], "openai") == {}
    assert serving_params([rec("openai.chat", temperature=0.0), rec("openai.chat")], "openai") == {"temperature": 0.0}
    assert serving_params([rec("openai.chat", temperature=True)], "openai") == {}  # not a number
    assert serving_params([], "openai") == {}

    assert auto_repeats({"temperature": 0}, ServingConditions({}, "records", 3)) == 1
    assert auto_repeats({"temperature": 0.7}, ServingConditions({}, "unknown")) == AUTO_REPEATS
    assert auto_repeats({}, ServingConditions({}, "records", 3)) == AUTO_REPEATS  # the runtime's default samples
    assert auto_repeats({}, ServingConditions({}, "unknown")) == 1


def test_contamination_compares_normalized_user_text():
    prompts = frozenset(normalize_prompt(p) for p in ["What is the capital of Italy?", "Hi"])
    tasks = [{"id": "a", "prompt": "what is THE capital   of italy?"},
             {"id": "b", "messages": [{"role": "system", "content": "Hi"}, {"role": "user", "content": "hi "}]},
             {"id": "c", "prompt": "What is the capital of Spain?"}]
    assert contaminated_tasks(tasks, prompts) == ["a", "b"]
    assert contaminated_tasks(tasks, frozenset()) == []
    # a /v1/responses record's input items are its user messages
    from reef_core.commit.tasks import user_texts

    assert user_texts({"instructions": "sys", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is the capital of Italy?"}]}]}) == ["What is the capital of Italy?"]
    assert user_texts({"input": "Hi"}) == ["Hi"]


class _SideRuntime(EchoRuntime):
    """Answers "yes" for the candidate and "no" for the current release (or crashes one side),
    a little later, counting the calls in flight."""

    def __init__(self, crash: str | None = None):
        super().__init__()
        self.crash = crash
        self.in_flight = self.most_in_flight = 0

    async def complete(self, call):
        self.calls.append(call)
        side = "candidate" if call.release and call.release.release_id.startswith("candidate:") else "current"
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.02)
        finally:
            self.in_flight -= 1
        if side == self.crash:
            raise RuntimeError(f"{side} fell over")
        return {"choices": [{"message": {"role": "assistant", "content": "yes" if side == "candidate" else "no"}}]}


def _candidate(tmp_path, record_ids=()):
    return Candidate(scenario="kit", recipe="r", artifact_dir=tmp_path, id="cand_stats", record_ids=list(record_ids))


YES_TASKS = [{"id": f"t{i}", "prompt": f"Question {i}?", "expected": "yes"} for i in range(4)]


def test_serving_params_given_to_the_context_reach_every_episode(tmp_path):
    runtime = _SideRuntime()
    with eval_context(runtime) as ctx:
        ctx.serving_params = {"temperature": 0.7, "top_p": 0.8}
        ctx.training_prompts = frozenset({"QUESTION 2?"})
        suite = TaskSuiteEvaluator(tasks=YES_TASKS, params={"top_p": None, "max_tokens": 5}, concurrency=4)
        evaluation, decision = run_gate(suite, "task_suite", _candidate(tmp_path), None, ctx, 30)
    m = evaluation.metrics
    assert m["repeats"] == AUTO_REPEATS and m["params"] == {"temperature": 0.7, "max_tokens": 5}
    assert m["serving"] == {"source": "context", "records": 0, "params": {"temperature": 0.7, "top_p": 0.8}}
    assert all(c.body["temperature"] == 0.7 and "top_p" not in c.body for c in runtime.calls)
    assert len(runtime.calls) == len(evaluation.episodes) == 2 * 4 * AUTO_REPEATS
    assert runtime.most_in_flight > 1  # both sides' episodes were in flight together
    assert m["contaminated_tasks"] == ["t2"] and "(t2)" in decision.reason
    assert decision.outcome == "select" and m["interval"] == [1.0, 1.0]


def test_greedy_params_make_one_repeat_and_every_candidate_crash_rejects(tmp_path):
    with eval_context(_SideRuntime(crash="candidate")) as ctx:
        ctx.serving_params = {"temperature": 0.7}
        suite = TaskSuiteEvaluator(tasks=YES_TASKS, params={"temperature": 0})
        evaluation, decision = run_gate(suite, "task_suite", _candidate(tmp_path), None, ctx, 30)
    assert evaluation.metrics["repeats"] == 1 and len(evaluation.episodes) == 8
    assert decision.outcome == "reject" and decision.reason.startswith("every candidate episode crashed (4); ")
    # nothing varied: the detectable effect assumes a 0/1 grader's worst spread, all of it between tasks
    assert decision.reason.endswith("with 4 task(s) × 1 repeat(s) this gate cannot detect even the largest "
                                    "improvement, +1 (it would take +1.60; power 0.8, assumed per-task sd 0.71)")
    crashed = [e for e in evaluation.episodes if e.side == "candidate"]
    assert all(e.score is None and e.answer is None and "RuntimeError: candidate fell over" in e.error
               and e.request["messages"][-1]["content"].startswith("Question") for e in crashed)


def test_threshold_records_the_interval(tmp_path):
    with eval_context(_SideRuntime()) as ctx:
        evaluation, decision = run_gate(ThresholdEvaluator(tasks=YES_TASKS, delta=0.5), "threshold",
                                        _candidate(tmp_path), None, ctx, 30)
    m = evaluation.metrics
    assert m["rule"] == "threshold" and m["delta"] == 0.5 and m["interval"] == [1.0, 1.0]
    assert decision.outcome == "select" and "≥ current mean 0.000 + delta 0.5" in decision.reason
    assert math.isclose(m["improvement"], 1.0)


@pytest.mark.parametrize("options, message", [
    ({"repeats": 0}, "repeats must be 1 or more"),
    ({"rule": "vibes"}, "rule must be one of"),
    ({"confidence": 1.0}, "confidence must be between 0 and 1"),
    ({"concurrency": 0}, "concurrency must be 1 or more"),
])
def test_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        TaskSuiteEvaluator(tasks=YES_TASKS, **options)
