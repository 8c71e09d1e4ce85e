"""reef_core.kit.records: recorded requests and answers of every route in Chat Completions shape."""

from __future__ import annotations

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
