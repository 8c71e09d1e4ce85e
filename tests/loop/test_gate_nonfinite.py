"""A grader that answers NaN or an infinite score crashed its episode: the score is no
evidence (NaN ranked as a tie, inf above every score and selected), and it never reaches the
evaluation the routes answer with (JSON has neither: the grow route and the releases answered
500)."""

from __future__ import annotations

import math
from contextlib import contextmanager

import pytest

from reef_core.testing import FakeUpstream, ReefServer

from .conftest import GOOD_FEEDBACK, TASKS, add_plugin, ask, capital_model, feedback_rules_config, report, settings_for


@contextmanager
def grown_once(tmp_path, evaluator: dict):
    """A server with ``evaluator``, one answer reported, one growth step asked over HTTP: the
    client and the step's result."""
    config = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator=evaluator)
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, config)) as server:
            client = server.client()
            r = ask(client, "What is the capital of Italy?")
            report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback=GOOD_FEEDBACK)
            grown = client.post("/reef/scenarios/default/grow")
            assert grown.status_code == 200, grown.text
            yield client, grown.json()


@pytest.mark.parametrize(("bad", "rule"), [(math.nan, "bootstrap"), (math.inf, "wins_minus_losses")])
def test_a_non_finite_grader_score_is_a_crashed_episode(tmp_path, bad, rule):
    # the candidate's (right) answers score ``bad``; the current release's (wrong) ones 0
    add_plugin("grader", "weird", lambda output, task: bad if task["expected"] in output else 0.0)
    evaluator = {"name": "task_suite", "tasks": [dict(t, grader="weird") for t in TASKS], "margin": 0,
                 "rule": rule, "repeats": 1, "episode_timeout_s": 30, "timeout_s": 120, "concurrency": 2}
    with grown_once(tmp_path, evaluator) as (client, result):
        assert result["outcome"] == "rejected", result["reason"]
        assert "every candidate episode crashed" in result["reason"]
        metrics = result["evaluation"]["metrics"]
        assert metrics["candidate_crashed"] == 2 and "not a finite score" in metrics["episode_errors"][0]
        assert client.get("/reef/scenarios/default/releases").json()["releases"] == []
        listed = client.get("/reef/scenarios/default/candidates")
        assert listed.status_code == 200 and listed.json()["candidates"][0]["decision"] == "reject"


class NonFiniteEvaluator:
    """A third-party gate whose evaluation holds NaN and infinite numbers (a spread of one
    sample, a ratio over zero); it selects."""

    def evaluate(self, candidate, current, ctx):
        from reef_core.types import Evaluation

        return Evaluation(evaluator="non_finite", candidate_scores=[math.nan, 1.0], current_scores=[0.0, -math.inf],
                          tasks=["a", "b"], metrics={"candidate_mean": math.inf, "spread": math.nan,
                                                     "wins": 1, "by_task": {"a": [math.nan, 0.5]}})

    def decide(self, evaluation):
        from reef_core.types import Decision

        return Decision("select", "the third-party gate selects")


def test_an_evaluation_with_non_finite_numbers_is_stored_and_answered_without_them(tmp_path):
    add_plugin("evaluator", "non_finite", NonFiniteEvaluator)
    with grown_once(tmp_path, {"name": "non_finite"}) as (client, result):
        assert result["outcome"] == "published"
        evaluation = result["evaluation"]
        assert evaluation["candidate_scores"] == [None, 1.0] and evaluation["current_scores"] == [0.0, None]
        assert evaluation["metrics"] == {"candidate_mean": None, "spread": None, "wins": 1,
                                         "by_task": {"a": [None, 0.5]}}
        for path in ("/reef/scenarios/default/candidates", f"/reef/scenarios/default/candidates/{result['candidate_id']}",
                     "/reef/scenarios/default/releases", f"/reef/scenarios/default/releases/{result['release_id']}",
                     "/reef/scenarios/default"):
            assert client.get(path).status_code == 200, path
