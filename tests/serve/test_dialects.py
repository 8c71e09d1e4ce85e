"""Dialect translation in isolation: requests, responses and streams, both directions."""

from __future__ import annotations

import json

import pytest

from reef_core.serve.dialects import StreamAssembler, stream_translator, translate_request, translate_response
from reef_core.serve.errors import ClientError


def test_openai_request_to_anthropic_full():
    body = {
        "model": "m", "max_completion_tokens": 77, "temperature": 0.2, "stop": "END", "user": "u1",
        "parallel_tool_calls": False, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                    "parameters": {"type": "object"}}}],
        "messages": [
            {"role": "system", "content": "sys1"},
            {"role": "developer", "content": [{"type": "text", "text": "sys2"}]},
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}]},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": ""}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r1"},
            {"role": "tool", "tool_call_id": "c2", "content": "r2"},
            {"role": "user", "content": "thanks"},
        ],
    }
    out = translate_request(body, "openai", "anthropic")
    assert out["system"] == "sys1\n\nsys2"
    assert out["max_tokens"] == 77 and out["temperature"] == 0.2 and out["stop_sequences"] == ["END"]
    assert out["metadata"] == {"user_id": "u1"}
    assert out["tools"] == [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]
    assert out["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    roles = [m["role"] for m in out["messages"]]
    assert roles == ["user", "assistant", "user"]  # alternating; tool results merged with the next user turn
    assert out["messages"][0]["content"][1] == {"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "QUJD"}}
    assert out["messages"][1]["content"] == [{"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
                                             {"type": "tool_use", "id": "c2", "name": "f", "input": {}}]
    assert out["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "c1", "content": "r1"},
                                             {"type": "tool_result", "tool_use_id": "c2", "content": "r2"},
                                             {"type": "text", "text": "thanks"}]


def test_anthropic_request_to_openai_full():
    body = {
        "model": "m", "max_tokens": 10, "system": [{"type": "text", "text": "sys"}], "stop_sequences": ["X"],
        "stream": True, "metadata": {"user_id": "u"},
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/i.png"}},
                                         {"type": "text", "text": "see"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                              {"type": "text", "text": "calling"},
                                              {"type": "tool_use", "id": "t1", "name": "f", "input": {"q": 2}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                          "content": [{"type": "text", "text": "bad"}]},
                                         {"type": "text", "text": "retry"}]},
        ],
    }
    out = translate_request(body, "anthropic", "openai")
    assert out["messages"][0] == {"role": "system", "content": "sys"}
    assert out["messages"][1]["content"][0] == {"type": "image_url", "image_url": {"url": "http://x/i.png"}}
    assert out["messages"][2] == {"role": "assistant", "content": "calling", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"q":2}'}}]}
    assert out["messages"][3] == {"role": "tool", "tool_call_id": "t1", "content": "[tool error] bad"}
    assert out["messages"][4] == {"role": "user", "content": "retry"}
    assert out["stop"] == ["X"] and out["user"] == "u" and out["max_tokens"] == 10
    assert out["stream_options"] == {"include_usage": True}
    assert [t["function"]["name"] for t in out["tools"]] == ["f"]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert out["parallel_tool_calls"] is False


def test_untranslatable_requests_are_client_errors():
    with pytest.raises(ClientError):
        translate_request({"n": 2, "messages": [{"role": "user", "content": "x"}]}, "openai", "anthropic")
    with pytest.raises(ClientError):
        translate_request({"messages": [{"role": "assistant", "tool_calls": [
            {"id": "c", "function": {"name": "f", "arguments": "{oops"}}]}]}, "openai", "anthropic")
    with pytest.raises(ClientError):
        translate_request({"messages": [{"role": "robot", "content": "x"}]}, "openai", "anthropic")


@pytest.mark.parametrize("stop,finish", [("end_turn", "stop"), ("max_tokens", "length"),
                                         ("tool_use", "tool_calls"), ("stop_sequence", "stop")])
def test_response_round_trip(stop, finish):
    anth = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": stop,
            "stop_sequence": None, "content": [{"type": "text", "text": "hi"},
                                               {"type": "tool_use", "id": "t", "name": "f", "input": {"a": [1]}}],
            "usage": {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 2}}
    oa = translate_response(anth, "anthropic", "openai")
    assert oa["choices"][0]["finish_reason"] == finish
    assert oa["choices"][0]["message"]["content"] == "hi"
    assert json.loads(oa["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {"a": [1]}
    assert oa["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
                           "prompt_tokens_details": {"cached_tokens": 2}}
    back = translate_response(oa, "openai", "anthropic")
    assert back["content"] == anth["content"]
    assert back["usage"] == {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 2}
    # an answer that called tools stopped for them, in Anthropic's words (whatever OpenAI's finish reason)
    assert back["stop_reason"] == ("max_tokens" if stop == "max_tokens" else "tool_use")


def _anthropic_events():
    return [
        {"type": "message_start", "message": {"id": "msg_9", "model": "m", "usage": {"input_tokens": 5}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "f",
                                                                      "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"x":'}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": " 1}"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}},
        {"type": "message_stop"},
    ]


def _run(tr, events):
    out = []
    for e in events:
        out += tr.feed(e)
    return out + tr.finish()


def test_stream_anthropic_to_openai_and_back():
    chunks = _run(stream_translator("anthropic", "openai"), _anthropic_events())
    asm = StreamAssembler("openai")
    for c in chunks:
        asm.add(c)
    msg = asm.result()
    assert msg["choices"][0]["message"]["content"] == "Hello"
    assert msg["choices"][0]["finish_reason"] == "tool_calls"
    assert msg["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert msg["usage"]["prompt_tokens"] == 5 and msg["usage"]["completion_tokens"] == 7
    events = _run(stream_translator("openai", "anthropic"), chunks)
    assert [e["type"] for e in events][0] == "message_start" and events[-1]["type"] == "message_stop"
    asm2 = StreamAssembler("anthropic")
    for e in events:
        asm2.add(e)
    back = asm2.result()
    assert back["content"] == [{"type": "text", "text": "Hello"},
                               {"type": "tool_use", "id": "t", "name": "f", "input": {"x": 1}}]
    assert back["stop_reason"] == "tool_use"
    assert back["usage"]["output_tokens"] == 7 and back["usage"]["input_tokens"] == 5
    cut = StreamAssembler("anthropic")  # the same stream cut before its message_delta: no count, not 0 and 0
    for e in events[:3]:
        cut.add(e)
    assert events[0]["message"]["usage"]["input_tokens"] == 0 and "usage" not in cut.result()


def test_an_answer_that_called_tools_stops_for_them_in_anthropic_whatever_its_finish_reason():
    """Gemini's OpenAI-compatible endpoint ends an answer that calls tools with ``stop``: an
    Anthropic agent loop runs tools only on ``stop_reason: tool_use``, so it would end its turn."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    whole = {"id": "x", "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}
    assert translate_response(whole, "openai", "anthropic")["stop_reason"] == "tool_use"
    chunks = [{"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
              {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    events = _run(stream_translator("openai", "anthropic"), chunks)
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    # without tool calls a stop is the end of the turn, and a cut answer says so
    plain = {"id": "x", "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant",
                                                                                       "content": "hi"}}]}
    assert translate_response(plain, "openai", "anthropic")["stop_reason"] == "max_tokens"
    plain["choices"][0]["finish_reason"] = "stop"
    assert translate_response(plain, "openai", "anthropic")["stop_reason"] == "end_turn"
    call_cut = {**whole, "choices": [{**whole["choices"][0], "finish_reason": "length"}]}
    assert translate_response(call_cut, "openai", "anthropic")["stop_reason"] == "max_tokens"


def test_stream_errors_and_partial_assembly():
    tr = stream_translator("anthropic", "openai")
    with pytest.raises(Exception, match="overloaded"):
        tr.feed({"type": "error", "error": {"type": "overloaded_error", "message": "overloaded"}})
    asm = StreamAssembler("anthropic")
    for e in _anthropic_events()[:7]:
        asm.add(e)
    partial = asm.result()
    assert partial["content"][0]["text"] == "Hello"
    assert partial["content"][1]["input"] == {"partial_json": '{"x":'}


# ---------------------------------------------------------------------------- Chat Completions -> a Responses upstream

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from reef_core.serve.dialects import translate_request as _translate  # noqa: E402
from reef_core.serve.dialects.responses_api import responses_to_chat  # noqa: E402

_TEXT = st.text(min_size=1, max_size=12)


@st.composite
def _conversations(draw):
    """Chat conversations: a system prompt, user turns, assistant text or tool calls and their results."""
    messages = [{"role": "system", "content": draw(_TEXT)}] if draw(st.booleans()) else []
    for turn in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(_TEXT)})
        if draw(st.booleans()):
            call = {"id": f"call_{turn}", "type": "function",
                    "function": {"name": draw(st.sampled_from(["read", "shell"])), "arguments": '{"x": 1}'}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": draw(_TEXT)})
        messages.append({"role": "assistant", "content": draw(_TEXT)})
    return messages


@given(_conversations(), st.sampled_from(["openai", "anthropic"]), st.integers(1, 500))
def test_a_chat_or_anthropic_request_reaches_a_responses_upstream_with_its_conversation_whole(messages, client, limit):
    """Whatever the conversation, translating a client's request to the Responses API and reading
    it back as Chat Completions (the other direction's translator) gives the same conversation."""
    if client == "anthropic":  # (ending with the assistant would be a prefill, refused before an OpenAI-style upstream)
        messages = [*messages, {"role": "user", "content": "go on"}]
    body = {"model": "gpt-5", "messages": messages, "max_tokens": limit}
    if client == "anthropic":
        body = _translate(body, "openai", "anthropic")
    sent = _translate(body, client, "responses")
    assert sent["max_output_tokens"] == limit and sent["store"] is False and "messages" not in sent
    back = responses_to_chat(sent)["messages"]

    def shape(ms):
        out = []
        for m in ms:
            calls = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                     for c in m.get("tool_calls") or []]
            out.append((m["role"], m.get("content") or None, m.get("tool_call_id"), calls))
        return out

    assert shape(back) == shape(messages)
