"""The official SDKs against Reef, in front of an OpenAI- and an Anthropic-speaking upstream."""

from __future__ import annotations

import json

import pytest

from reef_core.testing import system_prompt

DIALECTS = ["openai", "anthropic"]
WEATHER_TOOL_OPENAI = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
WEATHER_TOOL_ANTHROPIC = {"name": "get_weather", "description": "Weather of a city",
                          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                           "required": ["city"]}}


def _record(reef, receipt):
    r = reef.client().get(f"/reef/records/{receipt}")
    assert r.status_code == 200, r.text
    rec = r.json()
    assert rec["id"] == receipt
    assert rec["status"] == "ok"
    assert rec["runtime"] == "upstream"
    assert rec["scenario"] == "default"
    assert rec["finished_at"] and rec["latency_ms"] > 0
    assert rec["usage"]["input_tokens"] > 0 and rec["usage"]["output_tokens"] > 0
    return rec


@pytest.mark.parametrize("upstream", DIALECTS)
def test_openai_sdk_plain(reefs, upstream):
    reef = reefs[upstream]
    client = reef.openai()
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": "hello world"}],
        extra_headers={"x-reef-session": "s1", "x-reef-tag-team": "blue"})
    completion = raw.parse()
    assert completion.choices[0].message.content == "echo: hello world"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    rec = _record(reef, raw.headers["x-reef-agent-record-id"])
    assert rec["route"] == "openai.chat" and rec["finish_reason"] == "stop"
    assert rec["session"] == "s1" and rec["tags"] == {"team": "blue"}
    assert rec["request"]["messages"][1]["content"] == "hello world"
    assert rec["response"]["choices"][0]["message"]["content"] == "echo: hello world"
    assert "x-reef-release-id" not in raw.headers  # no release before the first one


@pytest.mark.parametrize("upstream", DIALECTS)
def test_openai_sdk_stream(reefs, upstream):
    reef = reefs[upstream]
    client = reef.openai()
    with client.chat.completions.with_streaming_response.create(
            model="fake-model", stream=True,
            messages=[{"role": "user", "content": "stream me please"}]) as resp:
        receipt = resp.headers["x-reef-agent-record-id"]
        chunks = list(resp.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo: stream me please"
    last = chunks[-1]
    assert last.choices == []
    assert last.model_extra["reef"] == {"agent_record_id": receipt, "release_id": None}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert not any(c.usage for c in chunks)  # usage chunk only when asked for
    rec = _record(reef, receipt)
    assert rec["response"]["choices"][0]["message"]["content"] == "echo: stream me please"


@pytest.mark.parametrize("upstream", DIALECTS)
def test_openai_sdk_stream_usage_when_asked(reefs, upstream):
    client = reefs[upstream].openai()
    chunks = list(client.chat.completions.create(model="fake-model", stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": "count me"}]))
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1 and usage[0].completion_tokens > 0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("upstream", DIALECTS)
def test_openai_sdk_tool_round_trip(reefs, upstream, stream):
    reef = reefs[upstream]
    client = reef.openai()
    messages = [{"role": "user", "content": "weather in Paris?"}]
    if stream:
        with client.chat.completions.stream(model="fake-model", messages=messages,
                                            tools=[WEATHER_TOOL_OPENAI]) as s:
            first = s.get_final_completion()
    else:
        first = client.chat.completions.create(model="fake-model", messages=messages, tools=[WEATHER_TOOL_OPENAI])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    messages.append({"role": "assistant", "content": choice.message.content,
                     "tool_calls": [{"id": call.id, "type": "function",
                                     "function": {"name": "get_weather", "arguments": call.function.arguments}}]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
    raw = client.chat.completions.with_raw_response.create(model="fake-model", messages=messages,
                                                           tools=[WEATHER_TOOL_OPENAI])
    assert raw.parse().choices[0].message.content == "The weather is sunny."
    rec = _record(reef, raw.headers["x-reef-agent-record-id"])
    assert rec["request"]["messages"][-1]["role"] == "tool"


@pytest.mark.parametrize("upstream", DIALECTS)
def test_anthropic_sdk_plain(reefs, upstreams, upstream):
    reef = reefs[upstream]
    client = reef.anthropic()
    raw = client.messages.with_raw_response.create(
        model="fake-model", max_tokens=64, system="You are terse.",
        messages=[{"role": "user", "content": "hello world"}])
    msg = raw.parse()
    assert msg.content[0].text == "echo: hello world"
    assert msg.stop_reason == "end_turn"
    assert msg.usage.output_tokens > 0
    rec = _record(reef, raw.headers["x-reef-agent-record-id"])
    assert rec["route"] == "anthropic.messages"
    assert system_prompt(upstreams[upstream].requests[-1]) == "You are terse."  # in the upstream's dialect
    assert rec["response"]["content"][0]["text"] == "echo: hello world"


@pytest.mark.parametrize("upstream", DIALECTS)
def test_anthropic_sdk_stream(reefs, upstream):
    reef = reefs[upstream]
    client = reef.anthropic()
    with client.messages.with_streaming_response.create(
            model="fake-model", max_tokens=64, stream=True,
            messages=[{"role": "user", "content": "stream me please"}]) as resp:
        receipt = resp.headers["x-reef-agent-record-id"]
        events = list(resp.parse())
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text == "echo: stream me please"
    assert events[-1].type == "message_stop"
    assert events[-1].model_extra["reef"] == {"agent_record_id": receipt, "release_id": None}
    rec = _record(reef, receipt)
    assert rec["response"]["content"][0]["text"] == "echo: stream me please"
    assert rec["response"]["stop_reason"] == rec["finish_reason"] == "end_turn"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("upstream", DIALECTS)
def test_anthropic_sdk_tool_round_trip(reefs, upstream, stream):
    reef = reefs[upstream]
    client = reef.anthropic()
    messages = [{"role": "user", "content": "weather in Paris?"}]
    kwargs = dict(model="fake-model", max_tokens=128, messages=messages, tools=[WEATHER_TOOL_ANTHROPIC])
    if stream:
        with client.messages.stream(**kwargs) as s:
            first = s.get_final_message()
    else:
        first = client.messages.create(**kwargs)
    assert first.stop_reason == "tool_use"
    use = [b for b in first.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "rainy"}]})
    raw = client.messages.with_raw_response.create(**{**kwargs, "messages": messages})
    assert raw.parse().content[0].text == "The weather is rainy."
    rec = _record(reef, raw.headers["x-reef-agent-record-id"])
    assert rec["request"]["messages"][-1]["content"][0]["type"] == "tool_result"


def test_upstream_receives_its_own_dialect(reefs, upstreams):
    """An OpenAI client in front of the Anthropic upstream: the system prompt arrives as ``system``."""
    reefs["anthropic"].openai().chat.completions.create(
        model="fake-model", messages=[{"role": "system", "content": "Be kind."},
                                      {"role": "user", "content": "hi"}])
    body = upstreams["anthropic"].requests[-1]
    assert body["system"] == "Be kind."
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert body["max_tokens"] == 4096
    reefs["openai"].anthropic().messages.create(model="fake-model", max_tokens=9, system="Be kind.",
                                                messages=[{"role": "user", "content": "hi"}])
    body = upstreams["openai"].requests[-1]
    assert body["messages"] == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}]
    assert body["max_tokens"] == 9


def test_models_route(reefs):
    reef = reefs["openai"]
    assert reef.openai().models.list().data == []
    r = reef.client().get("/v1/models", headers={"anthropic-version": "2023-06-01"})
    assert r.json() == {"data": [], "has_more": False, "first_id": None, "last_id": None}
