"""``POST /v1/responses``: the OpenAI Responses API on the serving path, through the official
``openai`` SDK and the OpenAI Agents SDK, against Chat Completions and Anthropic upstreams."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from reef_core.testing import FakeUpstream, ReefServer, Reply, ToolCall, parse_sse, system_prompt
from reef_core.types import ActiveRelease

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _tool_result_seen(body) -> str | None:
    """The tool result in an upstream request (either dialect), if any."""
    for m in body.get("messages") or []:
        if m.get("role") == "tool":
            return m["content"]
        if isinstance(m.get("content"), list):
            for b in m["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    return b["content"] if isinstance(b["content"], str) else json.dumps(b["content"])
    return None


def responder(body):
    result = _tool_result_seen(body)
    if result is not None:
        return f"It is {result} there."
    if body.get("tools"):
        return Reply(text="", tool_calls=[ToolCall("get_weather", {"city": "Paris"})])
    return "hello from upstream"


@pytest.fixture(params=["openai", "anthropic"])
def served(request, tmp_path):
    with FakeUpstream(request.param, responder) as up, ReefServer(tmp_path / "state", upstream=up) as reef:
        yield up, reef


def test_text_answer_is_recorded_with_its_receipt_as_the_response_id(served):
    up, reef = served
    raw = reef.openai().responses.with_raw_response.create(model="fake-model", input="Say hi",
                                                           instructions="Be nice.", max_output_tokens=50,
                                                           temperature=0.2)
    resp = raw.parse()
    receipt = raw.headers["x-reef-agent-record-id"]
    assert resp.id == receipt and resp.status == "completed"
    assert resp.output_text == "hello from upstream"
    assert resp.usage.output_tokens == 3 and resp.usage.total_tokens == resp.usage.input_tokens + 3
    sent = up.requests[-1]
    assert system_prompt(sent) == "Be nice."
    assert sent["max_tokens"] == 50 and sent["temperature"] == 0.2
    record = reef.store.get_record(receipt)
    assert record.route == "openai.responses" and record.status == "ok" and record.finish_reason == "stop"
    assert record.request["input"] == "Say hi" and record.response["output"][0]["type"] == "message"
    assert record.usage["output_tokens"] == 3


def test_stream_event_order_receipt_and_record(served):
    up, reef = served
    with reef.client() as c:
        r = c.post("/v1/responses", json={"model": "fake-model", "input": "stream it", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    kinds = [name for name, _ in events]
    assert kinds == [d["type"] for _, d in events]  # every event is named after its type
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[4:7] == ["response.output_text.delta"] * 3
    assert kinds[7:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                         "response.completed"]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    receipt = r.headers["x-reef-agent-record-id"]
    final = events[-1][1]
    assert final["reef"]["agent_record_id"] == receipt and final["response"]["id"] == receipt
    assert final["response"]["usage"]["output_tokens"] == 3
    record = reef.wait_record(receipt)
    assert record.status == "ok" and record.response["output"][0]["content"][0]["text"] == "hello from upstream"
    # the SDK's own stream helper assembles the same answer
    with reef.openai().responses.stream(model="fake-model", input="again") as s:
        assert [e.type for e in s][-1] == "response.completed"
        assert s.get_final_response().output_text == "hello from upstream"


@pytest.mark.parametrize("streamed", [False, True])
def test_function_call_round_trip_by_previous_response_id(served, streamed):
    up, reef = served
    client = reef.openai()

    def create(**kw):
        if not streamed:
            return client.responses.create(model="fake-model", tools=[WEATHER], **kw)
        with client.responses.stream(model="fake-model", tools=[WEATHER], **kw) as s:
            return s.get_final_response()

    first = create(input="Weather in Paris?", instructions="Use tools.")
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert reef.wait_record(first.id).finish_reason == "tool_calls"
    second = create(previous_response_id=first.id,
                    input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output_text == "It is sunny there."
    # the stored request and answer became the prefix; instructions are not carried over
    stored = reef.wait_record(second.id).request
    assert [i.get("type") for i in stored["input"]] == ["message", "function_call", "function_call_output"]
    assert stored["previous_response_id"] == first.id
    assert system_prompt(up.requests[-1]) == ""


def test_function_call_round_trip_with_the_whole_conversation(served):
    up, reef = served
    client = reef.openai()
    first = client.responses.create(model="fake-model", input="Weather?", tools=[WEATHER], store=False)
    call = first.output[0]
    items = [{"role": "user", "content": "Weather?"},
             {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": [{"type": "input_text",
                                                                                  "text": "rainy"}]},
             {"type": "reasoning", "id": "rs_1", "summary": []}]
    second = client.responses.create(model="fake-model", input=items, tools=[WEATHER], store=False)
    assert second.output_text == "It is rainy there." and second.store is False
    # store: false is honoured: the response cannot be continued, though it is recorded
    assert reef.store.get_record(first.id) is not None
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="fake-model", previous_response_id=first.id, input="more")
    assert err.value.body["param"] == "previous_response_id" and "store: false" in err.value.body["message"]


def test_previous_response_id_stays_in_its_scenario(tmp_path):
    with FakeUpstream("openai", responder) as up, ReefServer(tmp_path / "state", upstream=up) as reef:
        client = reef.openai()
        first = client.responses.create(model="fake-model", input="hi", extra_headers={"x-reef-scenario": "a"})
        for prev, scenario in ((first.id, "b"), ("rec_missing", "a")):
            with pytest.raises(openai.BadRequestError) as err:
                client.responses.create(model="fake-model", input="more", previous_response_id=prev,
                                        extra_headers={"x-reef-scenario": scenario})
            assert err.value.body["param"] == "previous_response_id"
            assert prev in err.value.body["message"]
        chained = client.responses.create(model="fake-model", input="more", previous_response_id=first.id,
                                          extra_headers={"x-reef-scenario": "a"})
        assert [m["content"] for m in up.requests[-1]["messages"]] == ["hi", "hello from upstream", "more"]
        assert reef.store.get_record(chained.id).scenario == "a"


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with FakeUpstream("openai", responder) as up, \
            ReefServer(tmp_path_factory.mktemp("responses") / "state", upstream=up) as reef:
        yield up, reef


@pytest.mark.parametrize("body, param, words", [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0.type", "'web_search'"),
    ({"input": "x", "tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools.0.type", "'file_search'"),
    ({"input": "x", "tools": [{"type": "computer_use_preview", "display_width": 1, "display_height": 1,
                               "environment": "linux"}]}, "tools.0.type", "'computer_use_preview'"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type", "'item_reference'"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input.0.type", "'web_search_call'"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input.0.content.0",
     "'input_file'"),
    ({"input": 3}, "input", "string or an array"),
    ({}, "input", "required"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "positive"),
    ({"input": "x", "top_logprobs": 5}, "top_logprobs", "returns no logprobs here"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input.0.content.0.text", "needs its 'text'"),
])
def test_bad_requests_are_openai_shaped_400s(shared, body, param, words):
    up, reef = shared
    before = len(up.requests)
    with pytest.raises(openai.BadRequestError) as err:
        reef.openai().responses.create(model="fake-model", **body)
    assert err.value.status_code == 400
    assert err.value.body["type"] == "invalid_request_error" and err.value.body["param"] == param
    assert words in err.value.body["message"]
    assert len(up.requests) == before  # nothing reached the upstream


def test_upstream_error_is_recorded_and_openai_shaped(tmp_path):
    with FakeUpstream("anthropic", responder) as up, ReefServer(tmp_path / "state", upstream=up) as reef:
        up.fail(429, "slow down")
        with pytest.raises(openai.RateLimitError) as err:
            reef.openai().responses.create(model="fake-model", input="hi")
        receipt = err.value.response.headers["x-reef-agent-record-id"]
        assert reef.store.get_record(receipt).status == "error"
        up.cut_stream(after_events=3)
        with reef.client() as c:
            r = c.post("/v1/responses", json={"model": "fake-model", "input": "hi", "stream": True})
        last = parse_sse(r.text)[-1]
        assert last[0] == "error" and last[1]["error"]["type"] == "api_error"
        assert reef.wait_record(r.headers["x-reef-agent-record-id"]).status == "incomplete"


def test_harness_reaches_instructions(tmp_path):
    root = tmp_path / "rel"
    (root / "harness").mkdir(parents=True)
    (root / "harness" / "rules.md").write_text("- Always answer in French.\n")
    with FakeUpstream("anthropic", responder) as up, ReefServer(tmp_path / "state", upstream=up) as reef:
        asyncio.run(reef.reef.releases.serve(ActiveRelease(scenario="s", release_id="rel-1", content_hash="c",
                                                           path=root)))
        raw = reef.openai().responses.with_raw_response.create(
            model="fake-model", input="hi", instructions="Be brief.", extra_headers={"x-reef-scenario": "s"})
        assert raw.headers["x-reef-release-id"] == "rel-1"
        sent = system_prompt(up.requests[-1])
        assert "Always answer in French." in sent and sent.endswith("Be brief.")
        record = reef.store.get_record(raw.headers["x-reef-agent-record-id"])
        assert "Always answer in French." in record.request["instructions"]


def test_openai_agents_sdk_runs_a_tool_loop(tmp_path):
    agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents) is not installed")

    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather of a city."""
        calls.append(city)
        return "sunny"

    with FakeUpstream("openai", responder) as up, ReefServer(tmp_path / "state", upstream=up) as reef:
        client = openai.AsyncOpenAI(base_url=f"{reef.url}/v1", api_key="unused", max_retries=0,
                                    default_headers={"x-reef-scenario": "agents", "x-reef-session": "run-1"})
        model = agents.OpenAIResponsesModel(model="fake-model", openai_client=client)
        agent = agents.Agent(name="helper", instructions="Answer about weather.", tools=[get_weather], model=model)
        result = agents.Runner.run_sync(agent, "Weather in Paris?",
                                        run_config=agents.RunConfig(tracing_disabled=True))
        assert calls == ["Paris"] and result.final_output == "It is sunny there."
        records = reef.store.list_records("agents", session="run-1")
        assert len(records) == 2 and {r.route for r in records} == {"openai.responses"}
        assert system_prompt(up.requests[0]) == "Answer about weather."


def test_namespace_tools_are_flattened_and_split_back(tmp_path):
    namespace = {"type": "namespace", "name": "agents", "description": "Sub-agents.",
                 "tools": [{**WEATHER, "name": "close_agent"}]}

    def ns_responder(body):
        if _tool_result_seen(body) is not None:
            return "closed"
        return Reply(text="", tool_calls=[ToolCall("agents__close_agent", {"city": "x"})])

    with FakeUpstream("anthropic", ns_responder) as up, ReefServer(tmp_path / "state", upstream=up) as reef:
        with reef.client() as c:
            first = c.post("/v1/responses", json={"model": "m", "input": "close it", "tools": [namespace]}).json()
            assert [t["name"] for t in up.requests[-1]["tools"]] == ["agents__close_agent"]
            call = first["output"][0]
            assert (call["name"], call["namespace"]) == ("close_agent", "agents")
            second = c.post("/v1/responses", json={"model": "m", "tools": [namespace], "input": [
                {"type": "function_call", "call_id": call["call_id"], "name": "close_agent", "namespace": "agents",
                 "arguments": call["arguments"]},
                {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}]}).json()
            assert second["output"][0]["content"][0]["text"] == "closed"
            assert up.requests[-1]["messages"][0]["content"][0]["name"] == "agents__close_agent"


def test_a_stored_response_is_retrieved_by_its_id(tmp_path):
    with FakeUpstream("openai", responder) as up, ReefServer(tmp_path / "state", upstream=up) as reef:
        client = reef.openai()
        made = client.responses.create(model="fake-model", input="Say hi")
        got = client.responses.retrieve(made.id)
        assert got.model_dump() == made.model_dump() and got.output_text == "hello from upstream"
        # a streamed answer is stored as its final response object
        with client.responses.stream(model="fake-model", input="Say hi") as events:
            final = events.get_final_response()
        got = client.responses.retrieve(final.id)  # (the stream's final object is the SDK's parsed subclass)
        assert (got.id, got.status, got.output_text, got.usage) == (final.id, "completed", final.output_text, final.usage)
        assert len(up.requests) == 2  # retrieving calls no model


def test_what_cannot_be_retrieved_is_an_openai_shaped_404(tmp_path):
    tokens = [{"token": "adm", "role": "admin"}, {"token": "only-a", "role": "infer", "scenarios": ["a"]}]
    with FakeUpstream("openai", responder) as up, \
            ReefServer(tmp_path / "state", upstream=up, tokens=tokens, token="adm") as reef:
        client = reef.openai()
        in_a = client.responses.create(model="fake-model", input="hi", extra_headers={"x-reef-scenario": "a"})
        unstored = client.responses.create(model="fake-model", input="hi", store=False)
        chat = reef.client().post("/v1/chat/completions",
                                  json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
        chat_receipt = chat.headers["x-reef-agent-record-id"]
        for rid, scenario, words in ((in_a.id, "default", "no stored response"),
                                     (unstored.id, "default", "store: false"),
                                     (chat_receipt, "default", "no stored response"),
                                     ("rec_missing", "a", "no stored response"),
                                     ("rec_\x00", "a", "no stored response")):
            with pytest.raises(openai.NotFoundError) as err:
                client.responses.retrieve(rid, extra_headers={"x-reef-scenario": scenario})
            assert words in err.value.body["message"] and err.value.body["type"] == "not_found_error"
        assert client.responses.retrieve(in_a.id, extra_headers={"x-reef-scenario": "a"}).id == in_a.id
        # a token limited to scenario a reads a, and nothing of the default scenario
        limited = reef.openai(token="only-a")
        assert limited.responses.retrieve(in_a.id, extra_headers={"x-reef-scenario": "a"}).id == in_a.id
        with pytest.raises(openai.PermissionDeniedError):
            limited.responses.retrieve(unstored.id)
        r = reef.client().get(f"/v1/responses/{in_a.id}", params={"stream": "true"}, headers={"x-reef-scenario": "a"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


@pytest.mark.parametrize("target", ["openai", "anthropic"])
def test_translation_errors_are_the_clients_400(monkeypatch, target):
    """The Responses translator runs under the same guard as the chat/messages ones: a tool type
    of the wrong type (never checked by a route here) is a ClientError, and so is any type error
    raised while translating a client's body."""
    from reef_core.serve.dialects import responses_api, translate_request
    from reef_core.serve.errors import ClientError

    for tools in ([{"type": []}], [{"type": "namespace", "name": "n", "tools": [{"type": {}}]}], [3]):
        with pytest.raises(ClientError):
            translate_request({"input": "x", "tools": tools}, "responses", target)

    def broken(body):
        raise TypeError("unhashable type: 'list'")

    monkeypatch.setattr("reef_core.serve.dialects.responses_to_chat", broken)
    with pytest.raises(ClientError) as err:
        translate_request({"input": "x"}, "responses", target)
    assert "TypeError" in str(err.value) and err.value.status == 400
    assert responses_api.responses_to_chat is not broken


def test_the_schema_names_every_field_reef_reads():
    """Every request field the translator or the echoed response object reads has a type in the
    published schema (so the schema-driven fuzzing covers it)."""
    from reef_core.serve.dialects.responses_api import _ECHO
    from reef_core.serve.dialects.responses_schema import REQUEST

    read = {*_ECHO, "model", "input", "stream", "store", "text", "instructions"}
    assert read <= set(REQUEST["properties"]), read - set(REQUEST["properties"])


@pytest.mark.parametrize("streamed", [False, True])
def test_a_chain_past_the_body_limit_is_a_413(tmp_path, streamed):
    """Each turn of a ``previous_response_id`` chain stores and sends the whole conversation; the
    continued request, prefix included, obeys ``server.max_body_bytes`` (a 413 naming it, in
    OpenAI's shape) like a body sent whole, so no record grows past what a client may send."""
    limit = 20_000
    with FakeUpstream("openai", lambda body: "y" * 3000) as up, \
            ReefServer(tmp_path / "state", [f"server.max_body_bytes={limit}"], upstream=up) as reef, \
            reef.client() as c:
        previous, sizes = None, []
        for _ in range(12):
            body = {"model": "m", "input": "x" * 2000, "stream": streamed}
            if previous:
                body["previous_response_id"] = previous
            before = len(up.requests)
            r = c.post("/v1/responses", json=body)
            if r.status_code != 200:
                break
            previous = r.headers["x-reef-agent-record-id"]
            sizes.append(len(json.dumps(reef.wait_record(previous).request)))
        assert r.status_code == 413, f"the chain ran {len(sizes)} turns: {sizes}"
        error = r.json()["error"]
        assert error["param"] == "previous_response_id" and error["code"] == "payload_too_large"
        assert "server.max_body_bytes" in error["message"] and error["type"] == "invalid_request_error"
        assert len(up.requests) == before  # refused before the upstream was called
        assert 2 <= len(sizes) and max(sizes) <= limit, sizes
        # a chain that starts over is served again
        assert c.post("/v1/responses", json={"model": "m", "input": "x" * 2000}).status_code == 200


def test_an_answer_cut_by_max_output_tokens_ends_in_an_incomplete_item():
    """As the Responses API answers: the response is ``incomplete`` and so is the item the cut
    ended; the items before it are complete, streamed or not."""
    from reef_core.serve.dialects.responses_api import ChatToResponsesStream, chat_to_responses

    body = {"model": "m", "choices": [{"index": 0, "finish_reason": "length",
                                       "message": {"role": "assistant", "content": "a long ans"}}]}
    out = chat_to_responses(body, {"input": "x"}, "rec_1")
    assert out["status"] == "incomplete" and out["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [i["status"] for i in out["output"]] == ["incomplete"]
    body["choices"][0]["finish_reason"] = "stop"
    assert [i["status"] for i in chat_to_responses(body, {"input": "x"}, "rec_1")["output"]] == ["completed"]

    stream = ChatToResponsesStream({"input": "x"}, "rec_2")
    events = []
    for delta, finish in (({"content": "some text"}, None),
                          ({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{\"a"}}]},
                           "length")):
        events += stream.feed({"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    events += stream.finish()
    final = events[-1]
    assert final["type"] == "response.incomplete"
    assert [i["status"] for i in final["response"]["output"]] == ["completed", "incomplete"]
    done = [e["item"]["status"] for e in events if e["type"] == "response.output_item.done"]
    assert done == ["completed", "incomplete"]


def test_a_stream_cut_before_its_end_is_recorded_with_its_open_item_incomplete():
    from reef_core.serve.dialects.responses_api import ChatToResponsesStream, ResponsesAssembler

    stream, assembler = ChatToResponsesStream({"input": "x"}, "rec_3"), ResponsesAssembler()
    for event in stream.feed({"model": "m", "choices": [{"index": 0, "delta": {"content": "half an"}}]}):
        assembler.add(event)
    recorded = assembler.result()  # the client left here: no terminal event
    assert recorded["status"] == "incomplete"
    assert [i["status"] for i in recorded["output"]] == ["incomplete"]
    assert recorded["output"][0]["content"][0]["text"] == "half an"
