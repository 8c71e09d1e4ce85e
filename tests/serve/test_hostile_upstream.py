"""A hostile or broken upstream, byte for byte (``raw_upstream.RawUpstream``): the client gets an
answer or an error in its own dialect, and the record says truthfully what happened."""

from __future__ import annotations

import json

import pytest
from raw_upstream import RawUpstream, http, sse_head

from reef_core.testing import ReefServer, parse_sse

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MSG = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
RESP = {"model": "m", "input": "hi"}
ROUTES = {"openai": ("/v1/chat/completions", CHAT), "anthropic": ("/v1/messages", MSG),
          "responses": ("/v1/responses", RESP)}


@pytest.fixture(scope="module")
def _rigs(tmp_path_factory):
    """A raw upstream and a Reef in front of it per dialect, overrides and URL userinfo, shared by
    the module's tests (each sets the upstream's script): a Reef's start is most of a test's time."""
    made: dict[tuple, tuple[RawUpstream, ReefServer]] = {}
    yield made, tmp_path_factory.mktemp("rigs")
    for up, reef in made.values():
        reef.stop()
        up.close()


@pytest.fixture
def rig(_rigs):
    """``rig(dialect, script, overrides=(), userinfo="")``: a raw upstream answering by ``script``
    and a Reef in front of it (``userinfo``: ``user:password@`` in the upstream URL)."""
    made, root = _rigs

    def make(dialect, script, overrides=(), userinfo=""):
        key = (dialect, tuple(overrides), userinfo)
        if key not in made:
            up = RawUpstream(script)
            url = up.url.replace("://", f"://{userinfo}", 1)
            reef = ReefServer(root / f"reef{len(made)}", upstream=url, dialect=dialect,
                              overrides=["runtime.timeout_s=5", *overrides]).start()
            made[key] = up, reef
        up, reef = made[key]
        up.script = script
        up.requests.clear()
        return up, reef

    return make


@pytest.mark.parametrize("client", ["openai", "anthropic", "responses"])
@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
def test_an_error_object_answered_with_200_is_an_error(rig, client, upstream):
    """Some gateways answer an error with status 200: that is no (empty) answer recorded as ok."""
    error = {"error": {"message": "quota exhausted", "type": "insufficient_quota"}} if upstream == "openai" else \
        {"type": "error", "error": {"type": "overloaded_error", "message": "quota exhausted"}}
    _, reef = rig(upstream, lambda path, body: [http(200, json.dumps(error).encode())])
    route, body = ROUTES[client]
    r = reef.client().post(route, json=body)
    assert r.status_code == 502
    err = r.json()
    message = err["error"]["message"]
    assert "quota exhausted" in message and (err.get("type") == "error") == (client == "anthropic")
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "error" and "quota exhausted" in record.error


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("client", ["openai", "anthropic"])
@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
def test_an_upstream_quoting_its_key_does_not_pass_it_on(rig, client, upstream, stream):
    """"Incorrect API key provided: sk-…": the key reaches neither the client nor the record."""
    key = "sk-live-0123456789abcdef"
    message = f"Incorrect API key provided: {key}. Your key is {key[:6]}...{key[-4:]}"
    error = {"error": {"message": message, "type": "invalid_request_error", "code": key}} if upstream == "openai" \
        else {"type": "error", "error": {"type": "authentication_error", "message": message}}
    up, reef = rig(upstream, lambda path, body: [http(401, json.dumps(error).encode())],
                   overrides=[f"runtime.api_key={key}"])
    route, body = ROUTES[client]
    r = reef.client().post(route, json={**body, "stream": stream})
    # Reef's own key refused: a 502 saying so, not a 401 the client would take for its own key refused
    assert r.status_code == 502 and "Incorrect API key provided: [redacted]" in r.text
    assert "refused Reef's own credentials with 401" in r.text
    assert key not in r.text
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "error" and "[redacted]" in record.error and key not in record.error
    sent = up.requests[0][1]
    assert key in (sent.get("authorization", "") + sent.get("x-api-key", ""))  # the upstream still gets it


def test_url_credentials_quoted_in_a_stream_error_are_redacted(rig):
    """Basic credentials (``user:password@`` in the URL) echoed in an in-stream error event."""
    def script(path, body):
        event = {"error": {"message": f"bad password s3cret-pass for {path}", "type": "auth"}}
        return [http(200, b"data: " + json.dumps(event).encode() + b"\n\n", ctype="text/event-stream")]

    up, reef = rig("openai", script, userinfo="user:s3cret-pass@")
    route, body = ROUTES["openai"]
    r = reef.client().post(route, json={**body, "stream": True})
    assert r.status_code == 502 and "s3cret-pass" not in r.text and "[redacted]" in r.text
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert "s3cret-pass" not in record.error
    assert up.requests[0][1]["authorization"].startswith("Basic ")


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _usage_chunk(usage: dict) -> bytes:
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": usage}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _event(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


BAD_USAGE = {"prompt_tokens": "3", "completion_tokens": -2, "total_tokens": None,
             "prompt_tokens_details": "none"}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("client", ["openai", "anthropic", "responses"])
def test_usage_that_is_no_count_still_leaves_a_record(rig, client, stream):
    """Token counts as strings, negative or null: the answer and its record are kept, the
    counts that are no count read as 0 (before, the record could not be built: a 500 and no
    record, or a stream whose record was lost)."""
    def script(path, body):
        if body.get("stream"):
            return [sse_head(), _chunk({"role": "assistant", "content": "hello"}), _chunk({}, "stop"),
                    _usage_chunk(BAD_USAGE), b"data: [DONE]\n\n"]
        answer = {"id": "c1", "object": "chat.completion", "created": 1, "model": "m", "usage": BAD_USAGE,
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}
        return [http(200, json.dumps(answer).encode())]

    _, reef = rig("openai", script)
    route, body = ROUTES[client]
    r = reef.client().post(route, json={**body, "stream": stream})
    receipt = r.headers["x-reef-agent-record-id"]
    record = reef.wait_record(receipt)
    if client == "openai":  # the same dialect: the answer goes through, its usage as sent
        assert r.status_code == 200 and "hello" in r.text and "error" not in r.text
        assert record.status == "ok" and record.finish_reason == "stop"
        assert record.usage == {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    else:  # translated, the counts cannot be: an error in the client's shape, recorded as one
        assert r.status_code in (200, 502) and "internal server error" not in r.text
        assert record.status in ("ok", "error", "incomplete")


@pytest.mark.parametrize("shape", ["details", "usage"])  # an output that is no list: no answer (below)
def test_an_odd_responses_answer_passed_through_still_leaves_a_record(rig, shape):
    """A Responses client before a Responses upstream gets the upstream's answer as it is; the
    record's finish reason and usage are read from it without failing on odd fields."""
    answer = {"id": "resp_1", "object": "response", "status": "completed", "model": "m",
              "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}],
              "usage": {"input_tokens": 2, "output_tokens": 3}}
    if shape == "details":
        answer.update(status="incomplete", incomplete_details="max_output_tokens")
    else:
        answer["usage"] = {"input_tokens": 2, "output_tokens": 3, "input_tokens_details": "none"}
    _, reef = rig("responses", lambda path, body: [http(200, json.dumps(answer).encode())])
    r = reef.client().post("/v1/responses", json=RESP)
    assert r.status_code == 200 and r.json()["id"] == "resp_1"
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "ok"
    assert record.usage == {"input_tokens": 2, "output_tokens": 3, "total_tokens": 5}


@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
def test_stream_events_that_do_not_assemble_still_leave_a_record(rig, upstream):
    """Events the client takes as they come but that fold into no answer (content that is not
    text, content block indices of mixed types): before, the stream's record was lost."""
    if upstream == "openai":
        events = [_chunk({"role": "assistant", "content": 5}), _chunk({}, "stop"), b"data: [DONE]\n\n"]
    else:
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
                   "usage": {"input_tokens": 1, "output_tokens": 1}}
        events = [_event({"type": "message_start", "message": message}),
                  _event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "a"}}),
                  _event({"type": "content_block_start", "index": "1", "content_block": {"type": "text", "text": "b"}}),
                  _event({"type": "message_stop"})]
    _, reef = rig(upstream, lambda path, body: [sse_head(), *events])
    route, body = ROUTES[upstream]
    r = reef.client().post(route, json={**body, "stream": True})
    assert r.status_code == 200
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "error" and "do not assemble" in record.error and record.response is None


@pytest.mark.parametrize("stream", [False, True])
def test_a_failed_responses_answer_is_recorded_as_an_error_streamed_or_not(rig, stream):
    """A Responses upstream's ``status: failed`` goes to a Responses client as it is; the record
    is an error either way (before, only the streamed one was)."""
    failed = {"id": "resp_1", "object": "response", "status": "failed", "model": "m", "output": [],
              "error": {"code": "server_error", "message": "the engine fell over"}}

    def script(path, body):
        if not body.get("stream"):
            return [http(200, json.dumps(failed).encode())]
        events = [{"type": "response.created", "sequence_number": 0, "response": {**failed, "status": "in_progress"}},
                  {"type": "response.failed", "sequence_number": 1, "response": failed}]
        return [sse_head(), *(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)]

    _, reef = rig("responses", script)
    r = reef.client().post("/v1/responses", json={**RESP, "stream": stream})
    assert r.status_code == 200 and "the engine fell over" in r.text
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "error" and "the engine fell over" in record.error


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("client", ["openai", "anthropic", "responses"])
def test_when_to_retry_reaches_the_client_with_the_upstreams_429(rig, client, stream):
    """The SDKs wait ``retry-after`` (or ``retry-after-ms``) before retrying a 429 or 503: relayed,
    so a client behind Reef backs off as the upstream asked; other upstream headers are not."""
    error = json.dumps({"error": {"message": "slow down", "type": "rate_limit_error"}}).encode()

    def script(path, body):
        if body.get("temperature") == 1:
            return [http(503, error, extra=b"retry-after-ms: 1500\r\n")]
        if body.get("temperature") == 0.5:
            return [http(429, error)]
        return [http(429, error, extra=b"retry-after: 7\r\nx-ratelimit-remaining-requests: 0\r\n"
                                       b"set-cookie: upstream=1\r\n")]

    _, reef = rig("openai", script)
    route, body = ROUTES[client]
    r = reef.client().post(route, json={**body, "stream": stream})
    assert r.status_code == 429 and "slow down" in r.text
    assert r.headers["retry-after"] == "7" and r.headers["x-reef-agent-record-id"]
    assert "x-ratelimit-remaining-requests" not in r.headers and "set-cookie" not in r.headers
    r = reef.client().post(route, json={**body, "stream": stream, "temperature": 1})
    assert r.status_code == 503 and r.headers["retry-after-ms"] == "1500" and "retry-after" not in r.headers
    r = reef.client().post(route, json={**body, "stream": stream, "temperature": 0.5})
    assert r.status_code == 429 and "retry-after" not in r.headers and "retry-after-ms" not in r.headers


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_client_is_told_no_usage_when_the_upstream_gave_none(rig, stream):
    """An OpenAI-compatible upstream that ignores ``stream_options.include_usage``: the answer's
    usage is null, streamed as not, and the record has none (a stream claimed 0 tokens)."""
    def script(path, body):
        if body.get("stream"):
            return [sse_head(), _chunk({"role": "assistant", "content": "hello"}), _chunk({}, "stop"),
                    b"data: [DONE]\n\n"]
        answer = {"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}
        return [http(200, json.dumps(answer).encode())]

    _, reef = rig("openai", script)
    r = reef.client().post("/v1/responses", json={**RESP, "stream": stream})
    assert r.status_code == 200
    answer = r.json() if not stream else next(e for _, e in parse_sse(r.text)
                                              if e.get("type") == "response.completed")["response"]
    assert answer["status"] == "completed" and answer["usage"] is None
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "ok" and record.usage is None


@pytest.mark.parametrize("client", ["openai", "anthropic", "responses"])
def test_a_responses_stream_ended_by_done_without_its_response_event_is_incomplete(rig, client):
    """A Responses stream ends with ``response.completed`` (``incomplete``, ``failed``): one cut
    before it, with a ``data: [DONE]`` a proxy added, is incomplete, not a finished answer (a
    Responses client was sent a made-up ``response.completed``, an Anthropic one ``end_turn``)."""
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "m", "output": []}
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}
    events = [{"type": "response.created", "response": response},
              {"type": "response.output_item.added", "output_index": 0, "item": item},
              {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1", "content_index": 0,
               "delta": "hel"}]
    _, reef = rig("responses", lambda path, body: [sse_head(), *map(_event, events), b"data: [DONE]\n\n"])
    route, body = ROUTES[client]
    r = reef.client().post(route, json={**body, "stream": True})
    assert r.status_code == 200 and "hel" in r.text
    last = parse_sse(r.text)[-1][1]
    assert "final event" in last["error"]["message"] and "response.completed" not in r.text
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "incomplete" and "final event" in record.error


def test_a_done_after_the_response_event_is_the_end_as_before(rig):
    done = {"id": "resp_1", "object": "response", "status": "completed", "model": "m", "output": [],
            "usage": {"input_tokens": 1, "output_tokens": 2}}
    _, reef = rig("responses", lambda path, body: [sse_head(), _event({"type": "response.completed", "response": done}),
                                                   b"data: [DONE]\n\n"])
    r = reef.client().post("/v1/responses", json={**RESP, "stream": True})
    assert parse_sse(r.text)[-1][1]["type"] == "response.completed"
    assert reef.wait_record(r.headers["x-reef-agent-record-id"]).status == "ok"


def _whole_call(call_id: str, name: str, arguments: str) -> dict:
    """A tool call as Gemini's OpenAI-compatible endpoint streams it: whole, without ``index``."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize("client", ["openai", "anthropic", "responses"])
def test_tool_calls_streamed_without_index_stay_apart(rig, client):
    """Two calls, each in its own chunk with its own id and no ``index``, then a third whose
    arguments come in two index-less pieces: three calls, not one with every argument appended."""
    events = [_chunk({"role": "assistant", "tool_calls": [_whole_call("call_a", "glob", '{"pattern": "*"}')]}),
              _chunk({"tool_calls": [_whole_call("call_b", "read", '{"path": "x"}')]}),
              _chunk({"tool_calls": [_whole_call("call_c", "grep", '{"q":')]}),
              _chunk({"tool_calls": [{"function": {"arguments": ' "y"}'}}]}),
              _chunk({}, "tool_calls"), b"data: [DONE]\n\n"]
    _, reef = rig("openai", lambda path, body: [sse_head(), *events])
    route, body = ROUTES[client]
    r = reef.client().post(route, json={**body, "stream": True})
    assert r.status_code == 200
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "ok"
    expected = [("call_a", "glob", {"pattern": "*"}), ("call_b", "read", {"path": "x"}), ("call_c", "grep", {"q": "y"})]
    answer = record.response
    if client == "openai":
        calls = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in answer["choices"][0]["message"]["tool_calls"]]
    elif client == "anthropic":
        calls = [(b["id"], b["name"], b["input"]) for b in answer["content"] if b["type"] == "tool_use"]
        starts = [e for _, e in parse_sse(r.text) if e.get("type") == "content_block_start"]
        assert [s["content_block"]["name"] for s in starts] == ["glob", "read", "grep"]
    else:
        calls = [(i["call_id"], i["name"], json.loads(i["arguments"])) for i in answer["output"]
                 if i["type"] == "function_call"]
    assert calls == expected


def test_a_done_with_stray_whitespace_ends_a_chat_stream(rig):
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
    _, reef = rig("openai", lambda path, body: [sse_head(), b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n",
                                                b"data: [DONE] \r\n\r\n"])
    r = reef.client().post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 200 and "error" not in r.text
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "ok" and record.error is None


@pytest.mark.parametrize("upstream", ["openai", "anthropic", "responses"])
@pytest.mark.parametrize("answer", [{}, {"status": "ok", "detail": "queued"},
                                    {"id": "x", "object": "response", "choices": 7, "content": 7, "output": 7}])
def test_json_that_is_no_answer_of_the_upstreams_api_is_an_error(rig, upstream, answer):
    """A gateway's own object with status 200 (``{}``, a status report) was relayed as the answer
    and recorded as ok; translated, it became an empty completion."""
    _, reef = rig(upstream, lambda path, body: [http(200, json.dumps(answer).encode())])
    route, body = ROUTES[upstream]
    r = reef.client().post(route, json=body)
    assert r.status_code == 502 and "no answer of its API" in r.text
    assert reef.wait_record(r.headers["x-reef-agent-record-id"]).status == "error"
