"""reef_core.kit.records: recorded requests and answers of every route in Chat Completions shape."""

from __future__ import annotations

import json

from reef_core.kit import chat_reply, chat_request


def test_a_chat_body_is_copied_with_its_messages():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    view = chat_request(body)
    assert view == body and view is not body and view["messages"][0] is not body["messages"][0]


def test_a_responses_body_becomes_messages_with_its_instructions_and_tool_round_trip():
    body = {"model": "m", "instructions": "Be brief.",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                      {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]}
    messages = chat_request(body)["messages"]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1]["role"] == "user" and "weather?" in str(messages[1]["content"])
    assert messages[2]["tool_calls"][0]["function"]["name"] == "weather"
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert chat_request({"input": "just text"})["messages"] == [{"role": "user", "content": "just text"}]


def test_an_anthropic_body_puts_its_system_first_and_unreadable_bodies_have_no_messages():
    body = {"system": [{"type": "text", "text": "Rules."}], "messages": [{"role": "user", "content": "hi"}]}
    view = chat_request(body)
    assert view["messages"] == [{"role": "system", "content": "Rules."}, {"role": "user", "content": "hi"}]
    assert "system" not in view and body["system"]  # the record is untouched
    assert chat_request(None) == {"messages": []}
    assert chat_request({"input": 7}) == {"messages": []}  # not a Responses input: nothing to read


def test_replies_of_each_route():
    chat = {"choices": [{"message": {"role": "assistant", "content": "4"}}]}
    assert chat_reply(chat) == {"role": "assistant", "content": "4"}
    responses = {"object": "response", "output": [
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 4."}]},
        {"type": "function_call", "call_id": "c9", "name": "calc", "arguments": "{\"x\": 1}"}]}
    assert chat_reply(responses) == {"role": "assistant", "content": "It is 4.", "tool_calls": [
        {"id": "c9", "type": "function", "function": {"name": "calc", "arguments": "{\"x\": 1}"}}]}
    anthropic = {"type": "message", "content": [{"type": "text", "text": "4"}]}
    assert chat_reply(anthropic) == {"role": "assistant", "content": [{"type": "text", "text": "4"}]}
    assert chat_reply(None) is None and chat_reply({"choices": []}) is None


# ---------------------------------------------------------------------------- a Responses upstream's records

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from reef_core.testing import responses_items as items  # noqa: E402

_HOSTED = st.sampled_from([{"type": "web_search"}, {"type": "file_search", "vector_store_ids": ["v"]},
                           {"type": "code_interpreter", "container": {"type": "auto"}},
                           {"type": "mcp", "server_label": "s", "server_url": "https://m.example"}])
_ITEM = st.one_of(
    st.builds(lambda t: {"type": "message", "role": "user", "content": t}, st.text(min_size=1, max_size=20)),
    st.builds(lambda t: items.reasoning(t), st.text(max_size=10)),
    st.builds(lambda q: items.web_search(q), st.text(max_size=10)),
    st.builds(lambda t: items.custom_tool_call("apply_patch", t, call_id="c_custom"), st.text(max_size=20)),
    st.just({"type": "custom_tool_call_output", "call_id": "c_custom", "output": "applied"}),
    st.builds(lambda n: items.function_call(n, {"x": 1}, call_id="c_fn"), st.sampled_from(["shell", "read"])),
    st.just({"type": "function_call_output", "call_id": "c_fn", "output": "ok"}),
    st.just({"type": "additional_tools", "tools": [{"type": "function", "name": "late", "parameters": {}}]}),
    st.just({"type": "mcp_call", "id": "mcp_1", "server_label": "s", "name": "t", "arguments": "{}"}),
)


@given(st.lists(_ITEM, min_size=1, max_size=12), st.lists(_HOSTED, max_size=3))
def test_a_responses_upstream_record_has_a_chat_view_whatever_items_it_holds(input_items, hosted):
    """Whatever a Codex-like client sent (reasoning, hosted calls, custom tools), the chat view
    keeps every message and tool exchange, shows custom calls as function calls, and leaves out
    reasoning and hosted tools; the record is untouched."""
    custom = {"type": "custom", "name": "apply_patch", "description": "Patch files."}
    body = {"model": "gpt-5", "instructions": "You are Codex.", "input": input_items,
            "tools": [custom, *hosted], "store": False, "include": ["reasoning.encrypted_content"]}
    before = json.dumps(body)
    messages = chat_request(body)["messages"]
    assert json.dumps(body) == before
    users = [i for i in input_items if i.get("role") == "user"]
    calls = [i for i in input_items if i["type"] in ("function_call", "custom_tool_call")]
    outputs = [i for i in input_items if i["type"] in ("function_call_output", "custom_tool_call_output")]
    if not users and not outputs and not calls:
        assert messages == []  # nothing a chat view can show
        return
    assert messages[0] == {"role": "system", "content": "You are Codex."}
    assert [m["content"] for m in messages if m["role"] == "user"] == [u["content"] for u in users]
    shown = [c["function"] for m in messages for c in m.get("tool_calls") or []]
    assert [c["name"] for c in shown] == [c["name"] for c in calls]
    assert [json.loads(c["arguments"]) for c in shown] == \
        [{"input": c["input"]} if c["type"] == "custom_tool_call" else {"x": 1} for c in calls]
    assert len([m for m in messages if m["role"] == "tool"]) == len(outputs)
    names = [t["function"]["name"] for t in chat_request(body).get("tools") or []]
    late = any(i["type"] == "additional_tools" for i in input_items)
    assert names == ["apply_patch"] + (["late"] if late else [])
    assert "encrypted" not in json.dumps(messages)


def test_a_responses_upstream_reply_shows_custom_calls_and_leaves_out_reasoning_and_hosted_calls():
    reply = {"object": "response", "output": [items.reasoning("hm"), items.web_search("q"),
                                              items.custom_tool_call("apply_patch", "*** Begin Patch", call_id="c9"),
                                              items.message("Done.")]}
    message = chat_reply(reply)
    assert message["content"] == "Done."
    assert message["tool_calls"] == [{"id": "c9", "type": "function", "function": {
        "name": "apply_patch", "arguments": json.dumps({"input": "*** Begin Patch"})}}]
