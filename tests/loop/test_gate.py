"""Commit gate over HTTP: losers, crashing and hanging evaluators are rejected and nothing is
published; an undecided candidate is not published either and says so; a scenario's own
evaluator overrides the root one."""

from __future__ import annotations

import logging
import threading

import pytest

from reef_core import hookimpl
from reef_core.testing import FakeUpstream, ReefServer, system_prompt
from reef_core.types import Decision, Evaluation

from .conftest import (
    GOOD_FEEDBACK,
    UndecidedEvaluator,
    add_plugin,
    ask,
    capital_model,
    feedback_rules_config,
    report,
    settings_for,
)


def _grow(client, scenario: str = "default") -> dict:
    r = client.post(f"/reef/scenarios/{scenario}/grow")
    assert r.status_code == 200, r.text
    return r.json()


def _feed(client, feedback: str, scenario: str | None = None, n: int = 1) -> None:
    for i in range(n):
        r = ask(client, f"What is the capital of Italy? ({i})", scenario=scenario)
        report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback=feedback, scenario=scenario)


class _Recorder:
    """An in-process plugin recording the loop's observer events."""

    def __init__(self, events: list):
        self.events = events

    @hookimpl
    def candidate_evaluated(self, candidate, evaluation, decision):
        self.events.append((candidate.id, decision.outcome))

    @hookimpl
    def release_published(self, release):
        self.events.append(release.release_id)


def test_losing_candidate_is_rejected_and_serving_is_unchanged(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, loop_enabled=False))
        with ReefServer(tmp_path, settings=settings) as server:
            events = []
            server.reef.register(_Recorder(events))
            client = server.client()
            _feed(client, GOOD_FEEDBACK)
            won = _grow(client)
            assert events == [(won["candidate_id"], "select"), won["release_id"]]
            assert won["outcome"] == "published"

            _feed(client, "Answer in a friendly tone")
            lost = _grow(client)
            assert lost["outcome"] == "rejected"
            assert lost["evaluation"]["metrics"]["wins"] == 0 and lost["evaluation"]["metrics"]["ties"] == 2
            assert "not above margin 0" in lost["reason"]
            assert events[-1] == (lost["candidate_id"], "reject")

            releases = client.get("/reef/scenarios/default/releases").json()
            assert [r["release_id"] for r in releases["releases"]] == [won["release_id"]]
            assert releases["serving_release_id"] == won["release_id"]
            candidates = client.get("/reef/scenarios/default/candidates").json()["candidates"]
            assert [(c["status"], c["decision"]) for c in candidates] == [("rejected", "reject"),
                                                                          ("published", "select")]
            up.reset()
            r = ask(client, "What is the capital of Italy?")
            assert r.headers["x-reef-release-id"] == won["release_id"]
            assert "friendly tone" not in system_prompt(up.requests[-1])

            nothing = _grow(client)
            assert nothing["outcome"] == "nothing" and "no eligible experience" in nothing["reason"]


def test_an_undecided_candidate_is_not_published_and_is_its_own_outcome(tmp_path):
    add_plugin("evaluator", "undecided", UndecidedEvaluator)
    config = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={"name": "undecided"})
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, config)) as server:
            events = []
            server.reef.register(_Recorder(events))
            client = server.client()
            _feed(client, GOOD_FEEDBACK)
            result = _grow(client)
            assert result["outcome"] == "undecided" and "undecided" in result["reason"]
            assert result["evaluation"]["decision"] == "undecided" and result["release_id"] is None
            assert events == [(result["candidate_id"], "undecided")]  # observers see it; nothing published

            assert client.get("/reef/scenarios/default/releases").json()["releases"] == []
            assert "x-reef-release-id" not in ask(client, "What is the capital of Italy?").headers
            detail = client.get(f"/reef/scenarios/default/candidates/{result['candidate_id']}").json()
            assert (detail["candidate"]["status"], detail["candidate"]["decision"]) == ("undecided", "undecided")
            # its experience returns to the pool under the retry rules, as a rejected candidate's does
            assert detail["experience"]["reports"].get("returned") and not detail["experience"]["reports"].get("held")
            listed = client.get("/reef/scenarios/default/candidates", params={"status": "undecided"}).json()
            assert [c["id"] for c in listed["candidates"]] == [result["candidate_id"]]
            metrics = client.get("/metrics").text
            assert 'reef_candidates_evaluated_total{outcome="undecided",recipe="feedback_rules",scenario="default"} 1.0' \
                in metrics


def test_a_suite_too_small_to_select_says_so_at_start_up(tmp_path, caplog):
    tiny = {"name": "task_suite", "tasks": [{"prompt": "What is the capital of Japan?", "expected": "Tokyo"}],
            "rule": "sign"}
    config = feedback_rules_config(loop_enabled=False, evaluator=tiny,
                                   scenarios={"wide": {"evaluator_options": {"rule": "bootstrap", "tasks": [
                                       {"prompt": f"Question {i}?", "expected": "yes"} for i in range(24)]}}})
    with FakeUpstream("openai", capital_model) as up, caplog.at_level(logging.WARNING, logger="reef.grow"):
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, config)):
            pass
    warned = [r.getMessage() for r in caplog.records if r.name == "reef.grow"]
    assert any(m.startswith("default: evaluator task_suite: the sign test over 1 task(s) can never select")
               for m in warned), warned
    assert not any(m.startswith("wide:") for m in warned)


class ExplodingEvaluator:
    """Raises while evaluating."""

    def evaluate(self, candidate, current, ctx):
        raise RuntimeError("the judge fell over")

    def decide(self, evaluation):
        return Decision("select")


class HangingEvaluator:
    """Never finishes within its timeout."""

    timeout_s = 0.5

    def __init__(self):
        self.release = threading.Event()

    def evaluate(self, candidate, current, ctx):
        self.release.wait(30)
        return Evaluation(evaluator="hanging")

    def decide(self, evaluation):
        return Decision("select")


class JunkDecider:
    """Decides with something that is not a Decision."""

    def evaluate(self, candidate, current, ctx):
        return Evaluation(evaluator="junk")

    def decide(self, evaluation):
        return "select"


@pytest.mark.parametrize("name, cls, reason", [
    ("exploding", ExplodingEvaluator, "RuntimeError: the judge fell over"),
    ("hanging", HangingEvaluator, "timed out after 0.5s"),
    ("junk", JunkDecider, "not a Decision"),
])
def test_failing_evaluator_rejects_and_publishes_nothing(tmp_path, name, cls, reason):
    add_plugin("evaluator", name, cls)
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, loop_enabled=False,
                                                                    evaluator={"name": name}))
        with ReefServer(tmp_path, settings=settings) as server:
            client = server.client()
            _feed(client, GOOD_FEEDBACK)
            result = _grow(client)
            assert result["outcome"] == "error"
            assert reason in result["reason"] and reason in result["evaluation"]["error"]
            assert client.get("/reef/scenarios/default/releases").json()["releases"] == []
            [candidate] = client.get("/reef/scenarios/default/candidates").json()["candidates"]
            assert candidate["status"] == "error" and candidate["decision"] == "error"
            assert reason in candidate["reason"]
            assert "x-reef-release-id" not in ask(client, "hello").headers
            if name == "hanging":
                server.reef.learning.plan("default").evaluator.release.set()


def test_scenario_evaluator_overrides_the_root_evaluator(tmp_path):
    scenarios = {"strict": {"evaluator": "task_suite",
                            "evaluator_options": {"tasks": [{"prompt": "What is the capital of Japan?",
                                                             "expected": "Tokyo"}]}}}
    config = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={"name": "always"},
                                   scenarios=scenarios)
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, config)) as server:
            client = server.client()
            _feed(client, "Answer in a friendly tone")
            _feed(client, "Answer in a friendly tone", scenario="strict")
            lenient = _grow(client)
            strict = _grow(client, "strict")
            assert lenient["outcome"] == "published" and lenient["evaluation"]["evaluator"] == "always"
            assert strict["outcome"] == "rejected" and strict["evaluation"]["evaluator"] == "task_suite"
            assert client.get("/reef/scenarios/strict").json()["loop"]["evaluator"] == "task_suite"
            assert client.get("/reef/scenarios/strict/releases").json()["releases"] == []
