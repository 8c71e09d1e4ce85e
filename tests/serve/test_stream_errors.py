"""An upstream error event that arrives in the same network read as the first events.

The events before the error must still reach the client, followed by an in-band error event,
and the record must be ``incomplete`` with the partial answer; an error as the very first
event stays a plain error answer.
"""

from __future__ import annotations

import json

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reef_core.builtins.upstream import UpstreamRuntime
from reef_core.errors import RuntimeCallError
from reef_core.kit.http_transport import HttpxSender
from reef_core.testing import ReefServer, ServerThread, parse_sse
from reef_core.types import InferenceCall

CHAT = {"model": "m", "messages": [{"role": "user", "content": "say hello"}]}
MSG = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "say hello"}]}
ROUTES = [("/v1/chat/completions", CHAT), ("/v1/messages", MSG)]
FAILURE = "the engine ran out of memory"


def _openai_chunk(delta: dict) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}


def _sse_payload(dialect: str, *, error_first: bool) -> bytes:
    """Some events of an answer, then an error event: everything in one body (one write)."""
    if dialect == "openai":
        events = [(None, _openai_chunk({"role": "assistant", "content": ""})),
                  (None, _openai_chunk({"content": "Hello"})), (None, _openai_chunk({"content": " wor"}))]
        error = (None, {"error": {"message": FAILURE, "type": "server_error", "param": None, "code": None}})
    else:
        events = [
            ("message_start", {"type": "message_start", "message": {
                "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1}}}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": "Hello"}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": " wor"}}),
        ]
        error = ("error", {"type": "error", "error": {"type": "overloaded_error", "message": FAILURE}})
    sent = [error] if error_first else [*events, error]
    return b"".join((f"event: {name}\n" if name else "").encode() + b"data: " + json.dumps(data).encode() + b"\n\n"
                    for name, data in sent)


class RawUpstream:
    """An upstream that answers every stream with one prepared SSE body, in one write."""

    def __init__(self, dialect: str):
        self.dialect = dialect
        self.error_first = False
        path = "/v1/chat/completions" if dialect == "openai" else "/v1/messages"
        self.server = ServerThread(Starlette(routes=[Route(path, self._handle, methods=["POST"])]),
                                   log_level="critical")

    async def _handle(self, request: Request) -> Response:
        await request.body()
        return Response(_sse_payload(self.dialect, error_first=self.error_first), media_type="text/event-stream")

    def __enter__(self) -> RawUpstream:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()




def _streamed_text(events: list) -> str:
    out = []
    for _, data in events:
        if not isinstance(data, dict):
            continue
        for choice in data.get("choices") or []:
            out.append((choice.get("delta") or {}).get("content") or "")
        if data.get("type") == "content_block_delta":
            out.append(data["delta"].get("text", ""))
    return "".join(out)


def _answer_text(response: dict) -> str:
    if "choices" in response:
        return response["choices"][0]["message"]["content"] or ""
    return "".join(block.get("text", "") for block in response["content"])


@pytest.fixture(scope="module", params=["openai", "anthropic"])
def upstream_and_reef(request, tmp_path_factory):
    with RawUpstream(request.param) as up, \
            ReefServer(tmp_path_factory.mktemp(f"reef-{request.param}"), upstream=up.server.url,
                       dialect=request.param) as reef:
        yield up, reef


@pytest.mark.parametrize("route,body", ROUTES)
def test_error_with_the_first_events_keeps_the_partial_answer(upstream_and_reef, route, body):
    up, reef = upstream_and_reef
    up.error_first = False
    r = reef.client().post(route, json={**body, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    assert _streamed_text(events) == "Hello wor"
    last = events[-1][1]
    assert "error" in last and FAILURE in last["error"]["message"]  # in-band, in the client's dialect
    if route == "/v1/messages":
        assert events[-1][0] == "error" and last["type"] == "error"
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "incomplete" and FAILURE in record.error
    assert _answer_text(record.response) == "Hello wor"


@pytest.mark.parametrize("route,body", ROUTES)
def test_error_as_the_first_event_is_a_plain_error_answer(upstream_and_reef, route, body):
    up, reef = upstream_and_reef
    up.error_first = True
    r = reef.client().post(route, json={**body, "stream": True})
    assert r.status_code == 502 and r.headers["content-type"].startswith("application/json")
    assert FAILURE in r.text
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "error" and FAILURE in record.error


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize("error_first", [False, True])
async def test_stream_batches_yields_events_before_the_error(dialect, error_first):
    """The runtime alone, on a transport that hands the whole body over in one chunk."""
    payload = _sse_payload(dialect, error_first=error_first)
    rt = UpstreamRuntime(upstream_url="http://upstream.test/v1", dialect=dialect, http_transport="httpx")
    rt._transport = HttpxSender(httpx.MockTransport(lambda request: httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=payload)))
    call = InferenceCall(scenario="s", record_id="r", body={**(CHAT if dialect == "openai" else MSG), "stream": True},
                         dialect=dialect)
    batches = []
    with pytest.raises(RuntimeCallError, match=FAILURE) as info:
        async for batch in rt.stream_batches(call):
            batches.append(batch)
    assert info.value.status == 502
    if error_first:
        assert batches == []
    else:
        assert len(batches) == 1 and _streamed_text([(None, e) for e in batches[0]]) == "Hello wor"


@pytest.mark.parametrize(("client", "runtime", "kept"), [
    ("responses", "openai", True), ("openai", "responses", True), ("openai", "openai", True),
    ("responses", "responses", True), ("anthropic", "openai", False), ("openai", "anthropic", False),
])
def test_a_runtime_error_keeps_its_code_for_a_client_that_reads_errors_alike(client, runtime, kept):
    """Chat Completions and Responses answer errors in one shape, so the runtime's body goes
    through whole (its ``code``, e.g. ``context_length_exceeded`` that agents compact on);
    another dialect gets the message re-shaped."""
    from reef_core.serve.errors import upstream_error_response

    body = {"error": {"message": "prompt is too long: 12000 tokens > 8192 maximum", "type": "invalid_request_error",
                      "param": "messages", "code": "context_length_exceeded"}}
    answer = upstream_error_response(client, runtime, RuntimeCallError(body["error"]["message"], status=400, body=body))
    got = json.loads(answer.body)
    assert answer.status_code == 400
    if (client, runtime) == ("responses", "openai"):  # kept, the param named as a Responses request names it
        assert got == {"error": {**body["error"], "param": "input"}}
    else:
        assert (got == body) is kept
    assert "prompt is too long" in json.dumps(got)
