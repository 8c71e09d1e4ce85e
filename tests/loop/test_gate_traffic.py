"""Gate tasks from the scenario's own scored traffic (``task_suite``'s ``traffic_tasks``):
drawn from reports whose grader can score a fresh answer, never from the candidate's batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reef_core.commit import traffic
from reef_core.commit.sequential import look_alphas, never_selects
from reef_core.commit.stats import sign_test
from reef_core.commit.tasks import BUILTIN_GRADERS, normalize_prompt
from reef_core.commit.traffic import MAX_PATTERN_CHARS, conversation, grading_of, traffic_tasks
from reef_core.testing import FakeUpstream, ReefServer

from .conftest import GOOD_FEEDBACK, add_plugin, ask, capital_model, feedback_rules_config, settings_for


def _post_report(client, receipt: str, score: float, metadata: dict | None = None, feedback: str | None = None):
    body = {"references": [receipt], "score": score, **({"metadata": metadata} if metadata else {}),
            **({"feedback": feedback} if feedback else {})}
    r = client.post("/reef/report", json=body)
    assert r.status_code == 200, r.text
    return r.json()["report_id"]


def test_traffic_tasks_come_from_scored_reports_outside_the_batch(tmp_path):
    config = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={
        "name": "task_suite", "tasks": [], "traffic_tasks": 10, "episode_timeout_s": 30, "timeout_s": 120})
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, config)) as server:
            client = server.client()
            # the batch: the oldest report, low score, the rule that makes the model name capitals
            trained = ask(client, "What is the capital of Italy?").headers["x-reef-agent-record-id"]
            batch_report = _post_report(client, trained, 0.0, {"pattern": "Rome"}, feedback=GOOD_FEEDBACK)
            drawn = {}
            for country, capital in (("France", "Paris"), ("Japan", "Tokyo")):
                receipt = ask(client, f"What is the capital of {country}?").headers["x-reef-agent-record-id"]
                drawn[country] = _post_report(client, receipt, 1.0, {"pattern": capital, "grader": "regex"})
            # left out: the batch's question asked again, no grader's pattern, a pattern that does not compile
            again = ask(client, "what is the capital of  ITALY?").headers["x-reef-agent-record-id"]
            _post_report(client, again, 1.0, {"pattern": "Rome"})
            plain = ask(client, "What is the capital of Spain?").headers["x-reef-agent-record-id"]
            _post_report(client, plain, 1.0)
            broken = ask(client, "What is the capital of Peru?").headers["x-reef-agent-record-id"]
            _post_report(client, broken, 1.0, {"pattern": "(Lima"})

            result = client.post("/reef/scenarios/default/grow").json()
            m = result["evaluation"]["metrics"]
            assert sorted(m["traffic_tasks"]) == sorted(f"traffic:{r}" for r in drawn.values())
            assert f"traffic:{batch_report}" not in m["traffic_tasks"] and m["contaminated_tasks"] == []
            assert m["n_tasks"] == 2 and set(result["evaluation"]["tasks"]) == set(m["traffic_tasks"])
            # the fresh answers are graded by the reports' patterns: the rule names the capitals
            assert result["outcome"] == "published", result["reason"]
            assert m["candidate_mean"] == 1.0 and m["current_mean"] == 0.0


def test_no_task_at_all_is_an_error_not_a_pass(tmp_path):
    config = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={
        "name": "task_suite", "tasks": [], "traffic_tasks": 5, "timeout_s": 60})
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, config)) as server:
            client = server.client()
            receipt = ask(client, "What is the capital of Italy?").headers["x-reef-agent-record-id"]
            _post_report(client, receipt, 0.0, {"pattern": "Rome"}, feedback=GOOD_FEEDBACK)
            result = client.post("/reef/scenarios/default/grow").json()
            assert result["outcome"] == "error" and "no gate task" in result["reason"]
            assert client.get("/reef/scenarios/default/releases").json()["releases"] == []


@pytest.mark.parametrize(("rule", "margin"), [("sign", 0.0), ("wins_minus_losses", 2)])
def test_too_few_traffic_tasks_to_ever_select_spend_no_episode(tmp_path, rule, margin):
    config = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={
        "name": "task_suite", "tasks": [], "traffic_tasks": 20, "rule": rule, "margin": margin,
        "params": {"temperature": 0}, "timeout_s": 60})
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, config)) as server:
            client = server.client()
            receipt = ask(client, "What is the capital of Italy?").headers["x-reef-agent-record-id"]
            _post_report(client, receipt, 0.0, {"pattern": "Rome"}, feedback=GOOD_FEEDBACK)
            for country, capital in (("France", "Paris"), ("Japan", "Tokyo")):  # two tasks: never enough
                receipt = ask(client, f"What is the capital of {country}?").headers["x-reef-agent-record-id"]
                _post_report(client, receipt, 1.0, {"pattern": capital})
            asked = len(up.requests)
            result = client.post("/reef/scenarios/default/grow").json()
            assert result["outcome"] == "error" and "2 gate task(s) from the scenario's graded traffic" in result["reason"]
            assert "never" in result["reason"] and len(up.requests) == asked  # no episode ran
            assert client.get("/reef/scenarios/default/releases").json()["releases"] == []


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 12), rule=st.sampled_from(["sign", "wins_minus_losses", "bootstrap"]),
       margin=st.sampled_from([0.0, 1, 3]), rounds=st.integers(1, 4))
def test_never_selects_agrees_with_what_the_rule_decides_when_every_task_improves(n, rule, margin, rounds):
    """A suite ``never_selects`` calls hopeless does not select even with every task 0 → 1;
    one it does not call so selects then (the best case every rule is judged by)."""
    alpha = 0.025
    best = max(look_alphas(alpha, rounds)) if rule in ("sign", "bootstrap") else alpha
    if rule == "sign":
        selects = n >= 1 and sign_test(n, 0) <= best
    elif rule == "wins_minus_losses":
        selects = n > margin
    else:
        selects = n >= 1
    assert never_selects(n, rule, margin, alpha, rounds) is (not selects)


def test_what_a_report_says_its_grader_needs():
    graders = dict(BUILTIN_GRADERS)
    assert grading_of({"pattern": r"\b42\b", "task": "t1"}, graders) == {"grader": "regex", "pattern": r"\b42\b"}
    assert grading_of({"expected": "Paris"}, graders) == {"grader": "contains", "expected": "Paris"}
    assert grading_of({"expected": "Paris", "grader": "exact"}, graders) == {"grader": "exact", "expected": "Paris"}
    for unusable in (None, "text", {}, {"task": "t1"}, {"pattern": "("}, {"pattern": "x", "grader": "vibes"},
                     {"pattern": "a" * (MAX_PATTERN_CHARS + 1)}, {"grader": "exact"}, {"pattern": 42}):
        assert grading_of(unusable, graders) is None, unusable


def test_a_recorded_request_becomes_a_text_conversation():
    anthropic = {"system": [{"type": "text", "text": "Be brief."}],
                 "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                           {"type": "image", "source": {}}]}]}
    assert conversation(anthropic) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    responses = {"instructions": "Be brief.", "input": "Hi"}
    assert conversation(responses)[-1] == {"role": "user", "content": "Hi"}
    assert conversation({"messages": [{"role": "assistant", "content": "Hello"}]}) == []  # no user turn
    assert conversation(None) == []


class _Store:
    """The three reads ``traffic_tasks`` makes."""

    def __init__(self, reports, records, lineage_trained=()):
        self.reports, self.records, self.lineage_trained = reports, records, set(lineage_trained)
        self.reads: list[int] = []  # how many records each read asked for

    def graded_report_rows(self, scenario, *, limit, max_meta_bytes):
        return [(r.id, r.references, r.meta) for r in self.reports[:limit]]

    def held_unpublished(self, ids):
        return self.lineage_trained.intersection(ids)

    def get_records(self, ids):
        self.reads.append(len(ids))
        return {i: self.records[i] for i in ids if i in self.records}


def _report(rid: str, record: str, **meta):
    return SimpleNamespace(id=rid, references=[record], meta=meta)


def _record(text: str):
    return SimpleNamespace(request={"messages": [{"role": "user", "content": text}]})


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_draw_is_seeded_deduplicated_and_bounded(seed):
    records = {f"rec{i}": _record(f"Question {i % 6}?") for i in range(12)}  # each question asked twice
    reports = [_report(f"rpt{i}", f"rec{i}", pattern="yes") for i in reversed(range(12))]  # newest first
    store = _Store(reports, records)
    kwargs = dict(graders=dict(BUILTIN_GRADERS), exclude_reports={"rpt11"}, exclude_records={"rec10"},
                  training_prompts=frozenset({normalize_prompt("Question 0?")}), seed=seed)
    tasks = traffic_tasks(store, "s", 50, **kwargs)
    # questions 1–5 once each (the newest report of each); question 0 is the batch's, rpt11/rec10 are its too
    asked = sorted(t["messages"][-1]["content"] for t in tasks)
    assert asked == [f"Question {i}?" for i in range(1, 6)]
    assert {t["id"] for t in tasks} == {f"traffic:rpt{i}" for i in (9, 8, 7, 5, 4)}
    assert traffic_tasks(store, "s", 3, **kwargs) == traffic_tasks(store, "s", 3, **kwargs)  # the same draw
    assert len(traffic_tasks(store, "s", 3, **kwargs)) == 3
    assert traffic_tasks(store, "s", 0, **kwargs) == [] and traffic_tasks(None, "s", 3, **kwargs) == []
    assert max(store.reads) <= traffic.RECORDS_A_READ  # a few records' bodies at a time, never the window's


def test_the_draw_reads_only_reports_whose_metadata_is_small(tmp_path):
    """A reporter's megabytes of metadata are never loaded for the draw (80 reports of 8 MB took
    the server from 197 MB to 2.8 GB): the database measures them and leaves them out."""
    from reef_core.store import Record, RecordStore, Report

    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    store.add_records([Record(id=f"rec{i}", scenario="s", request={"messages": [{"role": "user", "content": f"Q{i}?"}]})
                       for i in range(2)])
    store.add_report(Report(id="small", scenario="s", score=1.0, references=["rec0"], meta={"pattern": "yes"},
                            body_hash="a"))
    store.add_report(Report(id="big", scenario="s", score=1.0, references=["rec1"],
                            meta={"pattern": "yes", "padding": "x" * (traffic.MAX_METADATA_BYTES + 1)}, body_hash="b"))
    rows = store.graded_report_rows("s", limit=10, max_meta_bytes=traffic.MAX_METADATA_BYTES)
    assert [r[0] for r in rows] == ["small"]
    store.close()


@pytest.mark.parametrize("value", [-1, 1.5, True, "all"])
def test_traffic_tasks_is_checked(value):
    from reef_core.builtins.evaluators import TaskSuiteEvaluator

    with pytest.raises(ValueError, match="traffic_tasks must be 0 or more"):
        TaskSuiteEvaluator(tasks=[{"prompt": "A?", "expected": "a"}], traffic_tasks=value)
    assert TaskSuiteEvaluator(tasks=[], traffic_tasks=3).planned_tasks == 3


def test_a_reporters_pattern_cannot_hold_the_server():
    """A pattern that backtracks catastrophically fails its episode after the grader's time limit
    (it held a core and the GIL for minutes: /healthz took 260 s), and the 500-character bound
    holds whichever field the regex grader reads."""
    import threading
    import time

    from reef_core.commit.traffic import grading_of
    from reef_core.kit.graders import BUILTIN_GRADERS, REGEX_TIMEOUT_S, grade_regex

    ticks = []
    stop = threading.Event()

    def ticking():  # another thread keeps running while the match does: the GIL is released
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    ticker = threading.Thread(target=ticking)
    ticker.start()
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="took over"):
            grade_regex("a" * 80 + "!", {"pattern": "(a|aa)+$"})
    finally:
        stop.set()
        ticker.join()
    assert time.monotonic() - started < REGEX_TIMEOUT_S + 5
    assert len(ticks) > 10
    assert grading_of({"expected": "(?i)" + "x" * 5000, "grader": "regex"}, BUILTIN_GRADERS) is None
    assert grading_of({"expected": "y" * 501}, BUILTIN_GRADERS) is None
    assert grading_of({"pattern": "Paris|Rome"}, BUILTIN_GRADERS) == {"grader": "regex", "pattern": "Paris|Rome"}


def test_a_request_in_several_text_parts_is_the_same_prompt_on_both_sides_of_the_contamination_check():
    from reef_core.commit.tasks import normalize_prompt, user_texts
    from reef_core.commit.traffic import conversation

    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is the capital of Italy?"},
                                                      {"type": "text", "text": "Answer briefly."}]}]}
    [trained] = user_texts(body)
    [asked] = [m["content"] for m in conversation(body) if m["role"] == "user"]
    assert normalize_prompt(trained) == normalize_prompt(asked) == "what is the capital of italy? answer briefly."


def test_no_traffic_task_comes_from_what_the_lineage_trained_on(tmp_path):
    """A recipe that keeps a lineage trains it on every batch, whatever the verdict: a rejected (or
    errored) snapshot's batch stays consumed, and the next snapshot carries what it learnt. Its
    reports are no held-out tasks for the next candidate (serving never trained on them); they
    were drawn, and judged the lineage on its own training data."""
    from .test_lineage import LineageRuleRecipe

    add_plugin("recipe", "lineage_rule", LineageRuleRecipe)
    config = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={
        "name": "task_suite", "tasks": [], "traffic_tasks": 10, "rule": "wins_minus_losses", "margin": 0,
        "episode_timeout_s": 30, "timeout_s": 120})
    config["recipe"] = {"name": "lineage_rule", "batch_size": 1}
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, config)) as server:
            client = server.client()
            trained = _post_report(client, ask(client, "What is the capital of Italy?").headers["x-reef-agent-record-id"],
                                   0.0, {"pattern": "Rome"})
            first = client.post("/reef/scenarios/default/grow").json()
            assert first["outcome"] == "error" and "no gate task" in first["reason"]  # the lineage trained on it
            # a later report quoting the same record is no task either
            again = server.store.get_report(trained).references[0]
            _post_report(client, again, 1.0, {"pattern": "Rome"})
            for country, capital in (("France", "Paris"), ("Japan", "Tokyo")):
                _post_report(client, ask(client, f"What is the capital of {country}?").headers["x-reef-agent-record-id"],
                             0.0, {"pattern": capital})
            second = client.post("/reef/scenarios/default/grow").json()
            drawn = second["evaluation"]["metrics"]["traffic_tasks"]
            assert len(drawn) == 1 and f"traffic:{trained}" not in drawn, drawn
    # the draw's own rule, on a store double
    records = {f"rec{i}": _record(f"Question {i}?") for i in range(4)}
    reports = [_report(f"rpt{i}", f"rec{i}", pattern="yes") for i in range(4)]
    store = _Store(reports, records, lineage_trained={"rpt1", "rec2"})
    tasks = traffic_tasks(store, "s", 10, graders=dict(BUILTIN_GRADERS), exclude_reports=(), exclude_records=(),
                          training_prompts=frozenset(), seed=1)
    assert sorted(t["id"] for t in tasks) == ["traffic:rpt0", "traffic:rpt3"]
