"""Top-K logprob capture is opt-in per recipe: the kernel passes ``Recipe.top_logprobs`` to the
runtime as ``InferenceCall.top_logprobs`` and keeps what the runtime reports on the record;
scenarios whose recipe asks for nothing get 0 and record nothing."""

from __future__ import annotations

from typing import Any

import yaml

from reef_core import Recipe
from reef_core.runtime import Runtime
from reef_core.testing import ReefServer, registered
from reef_core.testing.reef_server import reef_settings
from reef_core.types import InferenceCall


class TopKRuntime(Runtime):
    """Reports K fake alternatives per response token when the call asks for K."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    async def complete(self, call: InferenceCall) -> dict[str, Any]:
        self.asked.append((call.scenario, call.top_logprobs))
        call.extras.update(prompt_token_ids=[1, 2], response_token_ids=[7, 8], logprobs=[-0.1, -0.2])
        if call.top_logprobs:
            call.extras["top_logprobs"] = [[[t + i, [-0.1, -0.2, -0.3][i]] for i in range(call.top_logprobs)] for t in (7, 8)]
        return {"id": "c", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}

    async def stream(self, call: InferenceCall):
        yield {}

    def models(self) -> list[str]:
        return ["m"]


class AsksTopK(Recipe):
    update_target = "none"
    filters = ()
    default_evaluator = "always"

    def __init__(self, batch_size: int = 0, top_k: int = 0):
        self.batch_size = batch_size
        self.top_logprobs = top_k

    def propose(self, batch, current, ctx):
        return None


def _ask(client, scenario: str) -> str:
    r = client.post("/v1/chat/completions", headers={"x-reef-scenario": scenario},
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    return r.headers["x-reef-agent-record-id"]


def test_top_logprobs_are_recorded_only_where_the_recipe_asks(tmp_path):
    config = {"recipe": {"name": "asks_top_k", "top_k": 0},
              "scenarios": {"learner": {"recipe_options": {"top_k": 3}}}}
    (tmp_path / "reef.yaml").write_text(yaml.safe_dump(config))
    runtime = TopKRuntime()
    with registered("recipe", "asks_top_k", AsksTopK):
        settings = reef_settings(tmp_path / "state", config_file=tmp_path / "reef.yaml")
        with ReefServer(tmp_path, settings=settings, runtime=runtime) as reef:
            client = reef.client()
            plain = reef.store.get_record(_ask(client, "default"))
            learner = reef.store.get_record(_ask(client, "learner"))
    assert runtime.asked == [("default", 0), ("learner", 3)]
    assert plain.top_logprobs is None
    assert learner.top_logprobs == [[[7, -0.1], [8, -0.2], [9, -0.3]], [[8, -0.1], [9, -0.2], [10, -0.3]]]
    assert learner.logprobs == [-0.1, -0.2]


def test_without_a_learning_loop_nothing_is_asked(tmp_path):
    runtime = TopKRuntime()
    with ReefServer(tmp_path, runtime=runtime, learning=False) as reef:
        rec = reef.store.get_record(_ask(reef.client(), "default"))
    assert runtime.asked == [("default", 0)] and rec.top_logprobs is None
