"""Request fields that change the answer, across the client/upstream pairings: each is carried
to the upstream in its own words or refused with a 400 naming it, never dropped in silence."""

from __future__ import annotations

import pytest

from reef_core.serve.dialects import translate_request
from reef_core.serve.errors import ClientError

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False}
USER = [{"role": "user", "content": "hi"}]


def test_a_json_schema_response_format_is_anthropic_structured_output():
    body = {"model": "m", "messages": USER, "reasoning_effort": "high",
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}}
    out = translate_request(body, "openai", "anthropic")
    # the effort stays behind: each provider takes one only for some of its models (requests.py says why)
    assert out["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}


def test_a_json_object_response_format_is_refused_before_an_anthropic_upstream():
    with pytest.raises(ClientError) as err:
        translate_request({"messages": USER, "response_format": {"type": "json_object"}}, "openai", "anthropic")
    assert err.value.param == "response_format"


def test_responses_text_format_and_reasoning_effort_reach_every_chat_upstream():
    body = {"model": "m", "input": "hi", "reasoning": {"effort": "low", "summary": "auto"},
            "text": {"format": {"type": "json_schema", "name": "o", "schema": SCHEMA, "strict": True}}}
    chat = translate_request(body, "responses", "openai")
    assert chat["reasoning_effort"] == "low"
    assert chat["response_format"]["json_schema"]["schema"] == SCHEMA
    anthropic = translate_request(body, "responses", "anthropic")
    assert anthropic["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}


@pytest.mark.parametrize("key", ["output_config", "output_format"])
def test_anthropic_structured_output_reaches_openai_and_responses_upstreams(key):
    fmt = {"type": "json_schema", "schema": SCHEMA}
    body = {"model": "m", "max_tokens": 9, "messages": USER,
            **({"output_config": {"format": fmt, "effort": "max"}} if key == "output_config"
               else {"output_format": fmt, "output_config": {"effort": "medium"}})}
    chat = translate_request(body, "anthropic", "openai")
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA}}
    assert "reasoning_effort" not in chat
    responses = translate_request(body, "anthropic", "responses")
    assert responses["text"]["format"]["schema"] == SCHEMA
    assert "reasoning" not in responses


PNG = "data:image/png;base64,iVBO"
SHOT_TOOL = {"name": "shot", "input_schema": {"type": "object", "properties": {}}}


def _image_urls(content):
    return [p["image_url"]["url"] for p in content if isinstance(p, dict) and p.get("type") == "image_url"] \
        if isinstance(content, list) else []


def test_an_anthropic_tool_result_image_reaches_an_openai_upstream_after_the_tool_messages():
    body = {"model": "m", "max_tokens": 9, "tools": [SHOT_TOOL], "messages": [
        {"role": "user", "content": "take two"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}},
                                          {"type": "tool_use", "id": "t2", "name": "shot", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": [
                {"type": "text", "text": "partial"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}]},
            {"type": "tool_result", "tool_use_id": "t2", "content": "none"},
            {"type": "text", "text": "go on"}]}]}
    out = translate_request(body, "anthropic", "openai")
    roles = [m["role"] for m in out["messages"]]
    assert roles == ["user", "assistant", "tool", "tool", "user"]
    assert out["messages"][2]["content"] == "[tool error] partial"
    assert _image_urls(out["messages"][4]["content"]) == [PNG]
    assert "t1" in out["messages"][4]["content"][0]["text"] and out["messages"][4]["content"][-1]["text"] == "go on"
    responses = translate_request(body, "anthropic", "responses")
    images = [p for item in responses["input"] if item.get("role") == "user" and isinstance(item["content"], list)
              for p in item["content"] if p["type"] == "input_image"]
    assert images == [{"type": "input_image", "image_url": PNG}]


def test_a_responses_function_output_image_reaches_chat_upstreams():
    body = {"model": "m", "tools": [{"type": "function", "name": "shot", "parameters": {"type": "object"}}], "input": [
        {"role": "user", "content": "shot"},
        {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "shot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_text", "text": "here"}, {"type": "input_image", "image_url": PNG}]},
        {"type": "function_call_output", "call_id": "c2", "output": "nothing"}]}
    chat = translate_request(body, "responses", "openai")
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "tool", "tool", "user"]
    assert chat["messages"][2]["content"] == "here"
    assert _image_urls(chat["messages"][4]["content"]) == [PNG]
    anthropic = translate_request(body, "responses", "anthropic")
    last = anthropic["messages"][-1]["content"]
    assert [b["type"] for b in last] == ["tool_result", "tool_result", "text", "image"]
    with pytest.raises(ClientError) as err:  # a file in a tool's output is refused like one in a message
        translate_request({**body, "input": [*body["input"][:3], {
            "type": "function_call_output", "call_id": "c1", "output": [{"type": "input_file", "file_id": "f"}]}]},
            "responses", "openai")
    assert err.value.param == "input.3.output.0"


def test_a_chat_tool_message_image_reaches_a_responses_upstream():
    body = {"model": "m", "messages": [
        {"role": "user", "content": "shot"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1",
         "content": [{"type": "text", "text": "here"}, {"type": "image_url", "image_url": {"url": PNG}}]}]}
    out = translate_request(body, "openai", "responses")
    assert out["input"][-1] == {"type": "function_call_output", "call_id": "c1", "output": [
        {"type": "input_text", "text": "here"}, {"type": "input_image", "image_url": PNG}]}


PDF = "JVBERi0xLjQK"


def test_a_chat_pdf_file_part_reaches_anthropic_and_responses_upstreams():
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "summarize"},
        {"type": "file", "file": {"filename": "a.pdf", "file_data": f"data:application/pdf;base64,{PDF}"}}]}]}
    anthropic = translate_request(body, "openai", "anthropic")
    assert anthropic["messages"][0]["content"][1] == {
        "type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}, "title": "a.pdf"}
    responses = translate_request(body, "openai", "responses")
    assert responses["input"][0]["content"][1] == {"type": "input_file", "filename": "a.pdf",
                                                   "file_data": f"data:application/pdf;base64,{PDF}"}


AUDIO = {"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}}


# (a file_id before a Responses upstream is fine: that upstream is OpenAI, whose files the client names)
@pytest.mark.parametrize("part,target", [(AUDIO, "anthropic"), (AUDIO, "responses"),
                                         ({"type": "file", "file": {"file_id": "file-1"}}, "anthropic")])
def test_content_a_chat_upstream_alone_reads_is_refused_naming_it(part, target):
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, part]}]}
    with pytest.raises(ClientError) as err:
        translate_request(body, "openai", target)
    assert err.value.param == "messages.0.content.1"


def test_an_anthropic_document_reaches_openai_and_responses_upstreams():
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}},
        {"type": "document", "title": "Notes", "source": {"type": "text", "media_type": "text/plain", "data": "n1"}},
        {"type": "text", "text": "summarize"}]}]}
    chat = translate_request(body, "anthropic", "openai")
    assert chat["messages"][0]["content"] == [
        {"type": "file", "file": {"filename": "document.pdf", "file_data": f"data:application/pdf;base64,{PDF}"}},
        {"type": "text", "text": "Notes\n\nn1"}, {"type": "text", "text": "summarize"}]
    responses = translate_request(body, "anthropic", "responses")
    assert [p["type"] for p in responses["input"][0]["content"]] == ["input_file", "input_text", "input_text"]
    with pytest.raises(ClientError) as err:  # a URL document: Chat Completions takes files inline only
        translate_request({**body, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "x"}, {"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}]}]},
            "anthropic", "openai")
    assert err.value.param == "messages.0.content.1.source"


@pytest.mark.parametrize("source,target,fields,param", [
    ("openai", "responses", {"stop": ["END"]}, "stop"),
    ("openai", "responses", {"n": 2}, "n"),
    ("openai", "responses", {"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ("openai", "anthropic", {"logprobs": True}, "logprobs"),
    ("openai", "anthropic", {"top_logprobs": 3}, "top_logprobs"),
    ("anthropic", "responses", {"stop_sequences": ["END"]}, "stop_sequences"),
])
def test_fields_that_would_change_the_answer_unseen_are_refused_naming_them(source, target, fields, param):
    body = {"model": "m", "max_tokens": 9, "messages": USER, **fields}
    with pytest.raises(ClientError) as err:
        translate_request(body, source, target)
    assert err.value.param == param


@pytest.mark.parametrize("target", ["openai", "responses"])
def test_an_anthropic_server_tool_is_refused_naming_it_not_dropped(target):
    body = {"model": "m", "max_tokens": 9, "messages": USER,
            "tools": [SHOT_TOOL, {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]}
    with pytest.raises(ClientError) as err:
        translate_request(body, "anthropic", target)
    assert err.value.param == "tools.1.type" and "web_search_20250305" in str(err.value)


def test_a_chat_tool_other_than_a_function_is_refused_before_an_anthropic_upstream():
    body = {"model": "m", "messages": USER, "tools": [{"type": "custom", "custom": {"name": "patch"}}]}
    with pytest.raises(ClientError) as err:
        translate_request(body, "openai", "anthropic")
    assert err.value.param == "tools.0"


@pytest.mark.parametrize("target", ["openai", "responses"])
def test_an_anthropic_prefill_is_refused_before_an_upstream_that_would_not_continue_it(target):
    body = {"model": "m", "max_tokens": 9, "messages": [*USER, {"role": "assistant", "content": '{"a":'}]}
    with pytest.raises(ClientError) as err:
        translate_request(body, "anthropic", target)
    assert err.value.param == "messages.1"
