"""``runtime.dialect: responses``: a Responses-speaking upstream (OpenAI itself).

``/v1/responses`` bodies go to the upstream as they came and its answers (reasoning items with
their ``encrypted_content``, custom and hosted tool calls, streamed events) come back as it sent
them, with Reef's receipt added; Chat Completions and Anthropic clients are translated to it.
Through the official ``openai`` SDK, the OpenAI Agents SDK and LiteLLM's Responses bridge, to
``FakeResponsesUpstream``.
"""

from __future__ import annotations

import asyncio
import json
import os

import openai
import pytest

from reef_core.testing import FakeResponsesUpstream, ReefServer, parse_sse
from reef_core.testing import responses_items as items
from reef_core.types import ActiveRelease

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

#: what Codex sends for a GPT-5-family model: a free-form tool, hosted tools, an additional_tools item
CUSTOM_TOOL = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
               "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
HOSTED_TOOLS = [{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["vs_1"]},
                {"type": "code_interpreter", "container": {"type": "auto"}},
                {"type": "mcp", "server_label": "docs", "server_url": "https://mcp.example/sse",
                 "require_approval": "never", "allowed_tools": {"read_only": True}}]
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ADDITIONAL_TOOLS = {"type": "additional_tools", "tools": [{"type": "function", "name": "late_tool",
                                                           "parameters": {"type": "object", "properties": {}}}]}


def agentic(body):
    """Reasoning, a hosted web search, a call of the custom tool, and some text."""
    return [items.reasoning("Planning the edit."), items.web_search("reef responses"),
            items.custom_tool_call("apply_patch", "*** Begin Patch\n*** End Patch"), items.message("Patched it.")]


@pytest.fixture
def native(tmp_path):
    with FakeResponsesUpstream(agentic) as up, ReefServer(tmp_path / "state", upstream=up) as reef:
        yield up, reef


def codex_body(**extra):
    return {"model": "gpt-5", "instructions": "You are Codex.", "store": False, "stream": False,
            "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "medium", "summary": "auto"},
            "tools": [CUSTOM_TOOL, WEATHER, *HOSTED_TOOLS], "tool_choice": "auto", "parallel_tool_calls": False,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix it"}]},
                      ADDITIONAL_TOOLS], **extra}


def test_a_responses_body_reaches_the_upstream_as_it_came_and_its_answer_comes_back_whole(native):
    up, reef = native
    body = codex_body()
    got = reef.client().post("/v1/responses", json=body)
    assert got.status_code == 200, got.text
    assert up.requests == [body]  # custom, hosted and additional tools: none refused, none changed
    answer = got.json()
    assert answer["id"].startswith("resp_fake_")  # the provider's id: previous_response_id follows it
    assert [o["type"] for o in answer["output"]] == ["reasoning", "web_search_call", "custom_tool_call", "message"]
    assert answer["output"][0]["encrypted_content"].startswith("gAAAA-encrypted-")
    record = reef.store.get_record(got.headers["x-reef-agent-record-id"])
    assert record.route == "openai.responses" and record.status == "ok"
    assert record.request == body and record.response == answer  # kept whole, encrypted reasoning as given
    assert record.usage["output_tokens"] == answer["usage"]["output_tokens"]


def test_streamed_events_come_back_as_sent_with_the_receipt_on_the_final_one(native):
    up, reef = native
    with reef.client().stream("POST", "/v1/responses", json=codex_body(stream=True)) as resp:
        assert resp.status_code == 200
        receipt = resp.headers["x-reef-agent-record-id"]
        events = parse_sse(resp.read().decode())
    sent = [data for _, data in events]
    expected = up._events(up.stored.get(sent[-1]["response"]["id"]) or sent[-1]["response"])
    assert sent[:-1] == expected[:-1]
    assert {k: v for k, v in sent[-1].items() if k != "reef"} == expected[-1]
    assert sent[-1]["reef"]["agent_record_id"] == receipt
    assert all(name == data["type"] for name, data in events)
    record = reef.store.get_record(receipt)
    assert record.status == "ok" and record.response == expected[-1]["response"]
    assert [o["type"] for o in record.response["output"]] == ["reasoning", "web_search_call", "custom_tool_call",
                                                              "message"]


def test_openai_sdk_create_stream_and_retrieve(native):
    up, reef = native
    client = reef.openai()
    created = client.responses.with_raw_response.create(model="gpt-5", input="hi", tools=[CUSTOM_TOOL, HOSTED_TOOLS[0]])
    first = created.parse()
    assert [o.type for o in first.output] == ["reasoning", "web_search_call", "custom_tool_call", "message"]
    assert first.output[2].input.startswith("*** Begin Patch") and first.output_text == "Patched it."
    with client.responses.stream(model="gpt-5", input="again") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.custom_tool_call_input.delta" in kinds and "response.web_search_call.completed" in kinds
    assert final.output_text == "Patched it." and final.output[0].encrypted_content
    # the provider's id is retrieved from the provider; a receipt from the record
    assert client.responses.retrieve(final.id).output_text == "Patched it." and up.retrieved == [final.id]
    by_receipt = client.responses.retrieve(created.headers["x-reef-agent-record-id"])
    assert by_receipt.id == first.id and up.retrieved == [final.id]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nowhere")


def test_previous_response_id_of_the_provider_passes_through_and_a_receipt_is_expanded(native):
    up, reef = native
    client = reef.openai()
    first = client.responses.with_raw_response.create(model="gpt-5", input="one")
    provider_id, receipt = first.parse().id, first.headers["x-reef-agent-record-id"]
    second = client.responses.with_raw_response.create(model="gpt-5", input="two", previous_response_id=provider_id)
    assert up.requests[-1] == {"model": "gpt-5", "input": "two", "previous_response_id": provider_id}
    assert reef.store.get_record(second.headers["x-reef-agent-record-id"]).request["previous_response_id"] == provider_id
    client.responses.create(model="gpt-5", input="three", previous_response_id=receipt)
    sent = up.requests[-1]["input"]
    assert sent[0] == {"type": "message", "role": "user", "content": "one"}
    # the stored answer goes on as the provider gave it: encrypted reasoning, hosted and custom calls
    assert sent[1:4] == first.parse().model_dump(exclude_none=True)["output"][:3] == \
        json.loads(json.dumps(reef.store.get_record(receipt).response["output"][:3]))
    assert sent[-1] == {"type": "message", "role": "user", "content": "three"}
    with pytest.raises(openai.BadRequestError):  # neither a receipt nor stored at the provider
        client.responses.create(model="gpt-5", input="x", previous_response_id="resp_unknown")


def test_reefs_checks_still_come_first(native):
    up, reef = native
    got = reef.client().post("/v1/responses", json={"model": "gpt-5", "input": "x", "tools": [{"type": []}]})
    assert got.status_code == 400 and got.json()["error"]["param"] == "tools.0.type"
    assert up.requests == []


def test_the_harness_goes_into_the_instructions_and_the_rest_as_it_came(tmp_path):
    root = tmp_path / "rel"
    (root / "harness").mkdir(parents=True)
    (root / "harness" / "rules.md").write_text("- Answer in French.\n")
    with FakeResponsesUpstream(agentic) as up, ReefServer(tmp_path / "state", upstream=up) as reef:
        asyncio.run(reef.reef.releases.serve(ActiveRelease(scenario="s", release_id="rel-1", content_hash="c",
                                                           path=root)))
        body = codex_body()
        got = reef.client().post("/v1/responses", json=body, headers={"x-reef-scenario": "s"})
        assert got.status_code == 200, got.text
        sent = up.requests[-1]
        assert "Answer in French." in sent["instructions"] and sent["instructions"].endswith("You are Codex.")
        assert {k: v for k, v in sent.items() if k != "instructions"} == \
            {k: v for k, v in body.items() if k != "instructions"}


def test_chat_completions_clients_are_translated_to_the_responses_upstream(native):
    up, reef = native
    client = reef.openai()
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-5", max_tokens=40, messages=[{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": "hi"}])
    answer = raw.parse()
    assert answer.id == raw.headers["x-reef-agent-record-id"] and answer.choices[0].message.content == "Patched it."
    assert answer.usage.completion_tokens_details.reasoning_tokens == 16
    assert up.requests[-1] == {"model": "gpt-5", "instructions": "Be brief.", "store": False, "max_output_tokens": 40,
                               "input": [{"type": "message", "role": "user", "content": "hi"}]}
    chunks = list(client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Patched it."
    assert all(c.usage is None for c in chunks)  # the client did not ask for usage


def test_chat_tool_calls_go_both_ways(tmp_path):
    def responder(body):
        done = [i for i in body["input"] if i.get("type") == "function_call_output"]
        return [items.message(f"It is {done[0]['output']}.")] if done else \
            [items.reasoning(), items.function_call("get_weather", {"city": "Paris"}, call_id="call_w")]

    tool = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
    with FakeResponsesUpstream(responder) as up, ReefServer(tmp_path / "state", upstream=up) as reef:
        client = reef.openai()
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        first = client.chat.completions.create(model="gpt-5", messages=messages, tools=[tool], tool_choice="auto")
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls" and call.id == "call_w"
        assert up.requests[-1]["tools"] == [{**WEATHER, "strict": False}]
        streamed = list(client.chat.completions.create(model="gpt-5", messages=messages, tools=[tool], stream=True))
        args = "".join(c.choices[0].delta.tool_calls[0].function.arguments or "" for c in streamed
                       if c.choices and c.choices[0].delta.tool_calls)
        assert json.loads(args) == {"city": "Paris"}
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": "call_w", "content": "sunny"}]
        second = client.chat.completions.create(model="gpt-5", messages=messages, tools=[tool])
        assert second.choices[0].message.content == "It is sunny."
        assert up.requests[-1]["input"][1:] == [
            {"type": "function_call", "call_id": "call_w", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_w", "output": "sunny"}]


def test_anthropic_clients_are_translated_to_the_responses_upstream(native):
    up, reef = native
    client = reef.anthropic()
    raw = client.messages.with_raw_response.create(model="gpt-5", max_tokens=64, system="Be brief.",
                                                   messages=[{"role": "user", "content": "hi"}])
    message = raw.parse()
    assert message.id == raw.headers["x-reef-agent-record-id"] and message.content[0].text == "Patched it."
    assert up.requests[-1]["instructions"] == "Be brief." and up.requests[-1]["max_output_tokens"] == 64
    with client.messages.stream(model="gpt-5", max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_message()
    assert final.content[0].text == "Patched it." and final.stop_reason == "end_turn"
    record = reef.store.list_records("default")[0]
    assert record.route == "anthropic.messages" and record.status == "ok"


def test_an_upstream_error_keeps_its_status_and_shape(native):
    up, reef = native
    got = reef.client().post("/v1/responses", json={"model": "gpt-5", "input": "x", "previous_response_id": "resp_x"})
    assert got.status_code == 400 and got.json()["error"]["param"] == "previous_response_id"
    assert reef.store.get_record(got.headers["x-reef-agent-record-id"]).status == "error"


def test_openai_agents_sdk_two_turns_with_a_tool(tmp_path):
    agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents) is not installed")

    def responder(body):
        done = [i for i in body["input"] if isinstance(i, dict) and i.get("type") == "function_call_output"]
        asked = [i for i in body["input"] if isinstance(i, dict) and i.get("role") == "user"]
        if len(done) < len(asked):
            return [items.reasoning("Need the weather."), items.function_call("get_weather", {"city": "Paris"})]
        return [items.reasoning(), items.message(f"It is {done[-1]['output']} there.")]

    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather of a city."""
        calls.append(city)
        return "sunny"

    with FakeResponsesUpstream(responder) as up, ReefServer(tmp_path / "state", upstream=up) as reef:
        client = openai.AsyncOpenAI(base_url=f"{reef.url}/v1", api_key="unused", max_retries=0,
                                    default_headers={"x-reef-scenario": "agents", "x-reef-session": "run-1"})
        model = agents.OpenAIResponsesModel(model="gpt-5", openai_client=client)
        agent = agents.Agent(name="helper", instructions="Answer about weather.", tools=[get_weather], model=model,
                             model_settings=agents.ModelSettings(store=False,
                                                                 response_include=["reasoning.encrypted_content"]))
        config = agents.RunConfig(tracing_disabled=True)
        first = agents.Runner.run_sync(agent, "Weather in Paris?", run_config=config)
        assert first.final_output == "It is sunny there."
        turn_one = up.requests[-1]["input"]
        second = agents.Runner.run_sync(agent, [*first.to_input_list(), {"role": "user", "content": "And now?"}],
                                        run_config=config)
        assert second.final_output == "It is sunny there." and calls == ["Paris", "Paris"]
        # turn 1's encrypted reasoning reaches the upstream unchanged on turn 2
        kept = [i["encrypted_content"] for i in turn_one if i.get("type") == "reasoning"]
        resent = [i["encrypted_content"] for i in up.requests[2]["input"] if i.get("type") == "reasoning"]
        assert kept and resent[:len(kept)] == kept
        records = reef.store.list_records("agents", session="run-1")
        assert len(records) == 4 and {r.route for r in records} == {"openai.responses"}
        assert all(r.request == sent for r, sent in zip(sorted(records, key=lambda r: r.created_at), up.requests))


def test_litellm_responses_bridge(native):
    litellm = pytest.importorskip("litellm")
    up, reef = native
    answer = litellm.responses(model="openai/gpt-5", input="hi", api_base=f"{reef.url}/v1", api_key="unused",
                               tools=[CUSTOM_TOOL])
    assert [o.type for o in answer.output][-1] == "message" and up.requests[-1]["tools"] == [CUSTOM_TOOL]
    events = list(litellm.responses(model="openai/gpt-5", input="hi", api_base=f"{reef.url}/v1", api_key="unused",
                                    stream=True))
    assert events[-1].type == "response.completed"
    assert len(reef.store.list_records("default")) == 2


def test_evaluators_and_recipes_speak_chat_completions_to_a_responses_runtime(tmp_path):
    """``EvalContext.complete`` (what evaluators and recipe proposers call) takes and returns Chat
    Completions bodies before a Responses runtime, translated both ways as for a chat client."""
    import logging
    import threading

    from reef_core.builtins.upstream import UpstreamRuntime
    from reef_core.commit.gate import EvalContext

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    with FakeResponsesUpstream(agentic) as up:
        runtime = UpstreamRuntime(upstream_url=up.url, dialect="responses")
        asyncio.run_coroutine_threadsafe(runtime.start(), loop).result()
        try:
            ctx = EvalContext(scenario="s", runtime=runtime, loop=loop, apply_harness=None,
                              log=logging.getLogger("test"), progress=None)
            assert ctx.dialect == "openai"
            answer = ctx.complete({"model": "gpt-5", "max_tokens": 20,
                                   "messages": [{"role": "system", "content": "Grade it."},
                                                {"role": "user", "content": "2+2?"}]}, None)
            assert answer["choices"][0]["message"]["content"] == "Patched it."
            assert up.requests[-1] == {"model": "gpt-5", "instructions": "Grade it.", "store": False,
                                       "max_output_tokens": 20,
                                       "input": [{"type": "message", "role": "user", "content": "2+2?"}]}
        finally:
            asyncio.run_coroutine_threadsafe(runtime.aclose(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)


def test_a_failed_or_broken_upstream_stream_is_recorded_as_such(native):
    up, reef = native
    up.fail_stream("the model is overloaded")
    with reef.client().stream("POST", "/v1/responses", json=codex_body(stream=True)) as resp:
        events = parse_sse(resp.read().decode())
        receipt = resp.headers["x-reef-agent-record-id"]
    assert events[-1][1]["type"] == "response.failed" and events[-1][1]["reef"]["agent_record_id"] == receipt
    record = reef.wait_record(receipt)
    assert record.status == "error" and "the model is overloaded" in record.error
    # cut inside the custom tool call: the record keeps what arrived, its partial input included
    events = up._events(up._response({}, "resp_x", agentic({})))
    cut = next(n for n, e in enumerate(events) if e["type"] == "response.custom_tool_call_input.done")
    up.cut_stream(after_events=cut)
    with reef.client().stream("POST", "/v1/responses", json=codex_body(stream=True)) as resp:
        last = parse_sse(resp.read().decode())[-1]
        receipt = resp.headers["x-reef-agent-record-id"]
    assert last[0] == "error"
    record = reef.wait_record(receipt)
    assert record.status == "incomplete"
    call = next(i for i in record.response["output"] if i["type"] == "custom_tool_call")
    assert call["input"] == "*** Begin Patch\n*** End Patch"
    assert record.response["output"][0]["encrypted_content"].startswith("gAAAA-encrypted-")
