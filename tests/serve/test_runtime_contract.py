"""Any runtime that follows the contract works behind the server: per-event streams (no
``stream_batches``), its own dialect, and ``call.extras`` kept on the record."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from reef_core.runtime import Runtime
from reef_core.testing import ReefServer
from reef_core.types import InferenceCall, base_release


class ScriptedRuntime(Runtime):
    """An Anthropic-speaking runtime that reports token ids and logprobs, like a local model."""

    dialect = "anthropic"

    def __init__(self) -> None:
        self.closed_streams = 0

    def _extras(self, call: InferenceCall) -> None:
        call.extras.update(prompt_token_ids=[1, 2, 3], response_token_ids=[7, 8], logprobs=[-0.1, -0.2],
                           logprobs_temperature=0.7, finish_reason="eos", adapter="lora-v3")

    async def complete(self, call: InferenceCall) -> dict[str, Any]:
        self._extras(call)
        return {"id": "msg_s", "type": "message", "role": "assistant", "model": "scripted",
                "content": [{"type": "text", "text": "hi there"}], "stop_reason": "end_turn",
                "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 2}}

    async def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        self._extras(call)
        try:
            yield {"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant",
                                                        "model": "scripted", "content": [],
                                                        "usage": {"input_tokens": 3, "output_tokens": 0}}}
            yield {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            for word in ("hi", " there"):
                yield {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}
            yield {"type": "content_block_stop", "index": 0}
            yield {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}
            yield {"type": "message_stop"}
        finally:
            self.closed_streams += 1

    def models(self) -> list[str]:
        return ["scripted"]


def test_scripted_runtime_behind_openai_clients(tmp_path):
    runtime = ScriptedRuntime()
    with ReefServer(tmp_path, runtime=runtime) as reef:
        client = reef.openai()
        raw = client.chat.completions.with_raw_response.create(model="scripted", messages=[
            {"role": "user", "content": "hello"}])
        assert raw.parse().choices[0].message.content == "hi there"
        rec = reef.store.get_record(raw.headers["x-reef-agent-record-id"])
        assert (rec.prompt_token_ids, rec.response_token_ids, rec.logprobs, rec.adapter) == \
            ([1, 2, 3], [7, 8], [-0.1, -0.2], "lora-v3")
        assert (rec.logprobs_temperature, rec.finish_reason) == (0.7, "eos")
        assert rec.model == "scripted" and rec.usage == {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}

        with client.chat.completions.with_streaming_response.create(
                model="scripted", stream=True, messages=[{"role": "user", "content": "hello"}]) as resp:
            receipt = resp.headers["x-reef-agent-record-id"]
            chunks = list(resp.parse())
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hi there"
        rec = reef.store.get_record(receipt)
        assert rec.status == "ok" and rec.logprobs == [-0.1, -0.2]
        assert rec.response["choices"][0]["message"]["content"] == "hi there"
        assert runtime.closed_streams == 1
        assert [m.id for m in client.models.list().data] == ["scripted"]


def test_a_request_before_the_first_release_names_the_base_to_the_runtime(tmp_path):
    """The record of a request that started before anything was published names no release, so the
    runtime is told to run it on the base: without a release on the call a runtime serves whatever
    its scenario serves when it takes the call up, which can be a release swapped in meanwhile."""
    runtime = ScriptedRuntime()
    seen = []
    answer = runtime.complete

    async def complete(call: InferenceCall) -> dict[str, Any]:
        seen.append(call.release)
        return await answer(call)

    runtime.complete = complete
    with ReefServer(tmp_path, runtime=runtime) as reef:
        raw = reef.openai().chat.completions.with_raw_response.create(
            model="scripted", messages=[{"role": "user", "content": "hello"}])
        assert reef.store.get_record(raw.headers["x-reef-agent-record-id"]).release_id is None
    assert seen == [base_release("default")]
