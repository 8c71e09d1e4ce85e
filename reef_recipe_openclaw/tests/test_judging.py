"""The judge's answers: ``\\boxed{}`` parsing, vote aggregation, hints, failed calls, the
dispatch table and the judges behind the ``judge`` option."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from reef_core import BASE_RELEASE_ID, ConfigError
from reef_recipe_openclaw import (
    Judge,
    aggregate_votes,
    build_judge,
    dispatch,
    hint_candidates,
    judge_turn,
    parse_boxed,
    parse_hint,
    register_judge,
    unregister_judge,
)
from reef_recipe_openclaw.judge import OpenAIJudge, RuntimeJudge, check_judge_spec
from reef_recipe_openclaw.sessions import BoundTurn, NextState, Turn
from reef_recipe_openclaw.testing import ScriptedJudge


def test_boxed_takes_the_last_box_and_only_votes():
    assert parse_boxed("first \\boxed{-1}, on reflection \\boxed{1}") == 1
    assert parse_boxed("\\boxed{ -1 }") == -1 and parse_boxed("\\boxed{+1}") == 1 and parse_boxed("\\boxed{0}") == 0
    assert parse_boxed("\\boxed{yes}") is None and parse_boxed("no box") is None and parse_boxed(None) is None
    assert parse_boxed("\\boxed{1} then \\boxed{2}") is None  # the last box decides, and 2 is no vote


def test_plurality_wins_ties_and_no_votes_are_zero():
    assert aggregate_votes([1, 1, -1]) == 1
    assert aggregate_votes([-1, None, None]) == -1          # failed votes do not count
    assert aggregate_votes([1, -1, 0]) == 0                  # three-way tie
    assert aggregate_votes([1, -1, None]) == 0               # tied plurality
    assert aggregate_votes([0, 0, 1]) == 0
    assert aggregate_votes([None, None]) == 0 and aggregate_votes([]) == 0


def test_hints_need_a_plus_one_and_both_markers_then_dedup_shortest_first_capped():
    assert parse_hint("\\boxed{1} [HINT_START] Be  brief. [HINT_END]") == (1, "Be brief.")
    assert parse_hint("\\boxed{-1} [HINT_START]Be brief please.[HINT_END]") == (-1, None)
    assert parse_hint("\\boxed{1} [HINT_START]no end") == (1, None)
    answers = [(1, "Use a table for the numbers."), (1, "Answer in one sentence."), (1, "answer in one SENTENCE."),
               (1, "Too short"), (-1, "Never shown because the vote is -1."), (1, "Show the two calculation steps."),
               (None, None)]
    assert hint_candidates(answers, 3) == ["Answer in one sentence.", "Use a table for the numbers.",
                                           "Show the two calculation steps."]
    assert hint_candidates(answers, 1) == ["Answer in one sentence."]


def _bound(next_text: str, role: str = "user") -> BoundTurn:
    turn = Turn(record_id="r1", session="tag:s", at=0.0, messages=(("user", "hi", ()),), reply=("assistant", "- a list", ()))
    return BoundTurn(turn, NextState(role, next_text, "r2"))


async def test_judge_turn_asks_m_times_each_and_counts_failed_calls():
    judge = ScriptedJudge()
    result = await judge_turn(judge, _bound("no, shorter"), m=3, temperature=0.6, max_tokens=64, timeout_s=5,
                              max_hint_candidates=3)
    assert len(judge.calls) == 6
    assert result.eval_votes == [-1, -1, -1] and result.eval_score == -1
    assert result.hints == ["Answer in one short sentence, without lists."]   # three equal hints, one candidate
    assert "no, shorter" in judge.calls[0][-1]["content"] and "- a list" in judge.calls[0][-1]["content"]

    class Flaky(Judge):
        def __init__(self):
            self.n = 0

        async def generate(self, messages, *, temperature, max_tokens):
            self.n += 1
            if self.n == 1:
                raise RuntimeError("judge down")
            if self.n == 2:
                await asyncio.sleep(5)
            return "\\boxed{1}"

    result = await judge_turn(Flaky(), _bound("thanks"), m=3, temperature=0.6, max_tokens=64, timeout_s=0.2,
                              max_hint_candidates=3)
    assert result.failed_calls == 2 and result.eval_votes == [None, None, 1] and result.eval_score == 1


def test_dispatch_table():
    hints = ["Answer briefly."]
    assert (dispatch(1, hints).outcome, dispatch(1, hints).reward, dispatch(1, hints).teachers) == ("hint_eval", 1.0,
                                                                                                    ("Answer briefly.",))
    assert (dispatch(-1, hints).outcome, dispatch(-1, hints).reward) == ("hint_eval", -1.0)
    assert (dispatch(0, hints).outcome, dispatch(0, hints).reward, dispatch(0, hints).teachers) == ("hint_only", 0.0,
                                                                                                    ("Answer briefly.",))
    assert (dispatch(-1, []).outcome, dispatch(-1, []).reward, dispatch(-1, []).teachers) == ("anchor", -1.0, (None,))
    assert (dispatch(1, []).outcome, dispatch(1, []).reward) == ("anchor", 1.0)
    retired = dispatch(0, [])
    assert retired.outcome == "retired" and not retired.trains
    with pytest.raises(ValueError):
        dispatch(2, [])


async def test_runtime_judge_calls_the_base_model_of_the_scenario():
    calls = []

    class Runtime:
        dialect = "openai"

        async def complete(self, call):
            calls.append(call)
            return {"choices": [{"message": {"role": "assistant", "content": "\\boxed{1}"}}]}

    judge = build_judge(None, runtime=Runtime(), scenario="s")
    assert isinstance(judge, RuntimeJudge)
    assert await judge.generate([{"role": "user", "content": "x"}], temperature=0.6, max_tokens=8) == "\\boxed{1}"
    (call,) = calls
    # a release without an artifact: every runtime serves it as the plain base (no adapter, no harness)
    assert call.release.scenario == "s" and call.release.release_id == BASE_RELEASE_ID
    assert call.release.adapter_dir is None and call.top_logprobs == 0
    assert call.body["temperature"] == 0.6 and call.body["max_tokens"] == 8


async def test_openai_judge_posts_chat_completions_with_the_key():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": "\\boxed{-1}"}}]})

    judge = OpenAIJudge(url="http://judge:8000/v1/", model="prm", api_key="k", transport=httpx.MockTransport(handler))
    assert await judge.generate([{"role": "user", "content": "x"}], temperature=0.2, max_tokens=16) == "\\boxed{-1}"
    await judge.aclose()
    (req,) = seen
    assert str(req.url) == "http://judge:8000/v1/chat/completions" and req.headers["authorization"] == "Bearer k"
    assert json.loads(req.content) == {"model": "prm", "messages": [{"role": "user", "content": "x"}],
                                       "temperature": 0.2, "max_tokens": 16}


def test_judge_plugins_and_bad_specs():
    class Classifier(Judge):
        def __init__(self, threshold: float = 0.5):
            self.threshold = threshold

        async def generate(self, messages, *, temperature, max_tokens):
            return "\\boxed{1}"

    register_judge("classifier", Classifier)
    try:
        judge = build_judge({"name": "classifier", "threshold": 0.9}, runtime=None, scenario="s")
        assert isinstance(judge, Classifier) and judge.threshold == 0.9
        check_judge_spec({"name": "classifier"})
    finally:
        unregister_judge("classifier")
    assert build_judge({"name": "none"}, runtime=None, scenario="s") is None
    with pytest.raises(ConfigError, match="unknown judge 'nope'"):
        check_judge_spec({"name": "nope"})
    with pytest.raises(ConfigError, match="needs url"):
        check_judge_spec({"name": "openai", "model": "m"})
    with pytest.raises(ConfigError, match="does not take"):
        check_judge_spec({"name": "runtime", "url": "x"})
