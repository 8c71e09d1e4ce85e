"""The session index on scripted traffic: tags, trace matching, retries, tool next states,
side calls, TTL expiry, ties and the open-session cap."""

from __future__ import annotations

from reef_recipe_openclaw import SessionIndex
from reef_recipe_openclaw.sessions import trailing_message
from reef_recipe_openclaw.testing import chat_record


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


def test_tagged_turns_bind_in_arrival_order_to_the_next_user_message():
    idx = SessionIndex(ttl_s=60)
    assert idx.observe(chat_record("r1", [u("hi")], "hello!", session="s", at=0)).bound == []
    obs = idx.observe(chat_record("r2", [u("hi"), a("hello!"), u("no, shorter")], "hi", session="s", at=1))
    (bound,) = obs.bound
    assert bound.turn.record_id == "r1" and bound.turn.session == "tag:s"
    assert (bound.next_state.role, bound.next_state.text, bound.next_state.record_id) == ("user", "no, shorter", "r2")
    assert idx.pending("tag:s").record_id == "r2"          # one unbound turn per session
    # a tag binds by arrival order even when the messages do not extend (the harness said so)
    (bound,) = idx.observe(chat_record("r3", [u("other")], "x", session="s", at=2)).bound
    assert bound.turn.record_id == "r2" and bound.next_state.text == "other"


def test_trace_matching_binds_a_request_that_extends_the_served_reply():
    idx = SessionIndex(ttl_s=60)
    idx.observe(chat_record("r1", [u("what is 2+2?")], "4", at=0))
    # the reply must sit right after the old request, and one more message must follow
    assert idx.observe(chat_record("x1", [u("what is 2+2?"), a("5"), u("really?")], "?", at=1)).bound == []
    assert idx.observe(chat_record("x2", [u("what is 2+2?"), a("4")], "?", at=2)).bound == []
    (bound,) = idx.observe(chat_record("r2", [u("what is 2+2?"), a("4"), u("thanks")], "welcome", at=3)).bound
    assert (bound.turn.record_id, bound.next_state.text) == ("r1", "thanks")
    # system messages (a harness that changed between turns) do not break the match
    (bound,) = idx.observe(chat_record("r3", [{"role": "system", "content": "be brief"}, u("what is 2+2?"), a("4"),
                                              u("thanks"), a("welcome"), u("bye")], "bye", at=4)).bound
    assert (bound.turn.record_id, bound.next_state.text) == ("r2", "bye")


def test_an_identical_request_is_a_retry_and_is_dropped():
    idx = SessionIndex(ttl_s=60)
    idx.observe(chat_record("r1", [u("hi")], "hello", at=0))
    obs = idx.observe(chat_record("r1b", [u("hi")], "hey", at=1))
    assert obs.dropped == "retry" and obs.bound == [] and len(idx) == 1
    tagged = SessionIndex(ttl_s=60)
    tagged.observe(chat_record("t1", [u("hi")], "hello", session="s", at=0))
    assert tagged.observe(chat_record("t1b", [u("hi")], "hey", session="s", at=1)).dropped == "retry"
    assert tagged.pending("tag:s").record_id == "t1"


def test_a_tool_result_is_the_next_state_with_its_role():
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}]}
    idx = SessionIndex(ttl_s=60)
    rec1 = chat_record("r1", [u("add 2 and 2")], "", at=0)
    rec1.response["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": call["tool_calls"]}
    idx.observe(rec1)
    # arguments re-serialised with other spacing still match
    call2 = {**call, "tool_calls": [{"id": "c1", "type": "function",
                                     "function": {"name": "add", "arguments": '{"b":2,"a":2}'}}]}
    (bound,) = idx.observe(chat_record("r2", [u("add 2 and 2"), call2,
                                              {"role": "tool", "tool_call_id": "c1", "content": "ERROR: overflow"}],
                                       "sorry", at=1)).bound
    assert (bound.next_state.role, bound.next_state.text) == ("tool", "ERROR: overflow")
    # Anthropic: a tool result is a user message holding tool_result blocks
    body = {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                       "content": [{"type": "text", "text": "42"}]}]}]}
    assert trailing_message(body, "anthropic.messages") == ("tool", "42")


def test_side_calls_and_unserved_records_are_dropped():
    idx = SessionIndex(ttl_s=60, main_turn_requires_tools=True)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert idx.observe(chat_record("t", [u("title this")], "A title", at=0)).dropped == "side_call"
    assert idx.observe(chat_record("s", [u("x")], "y", tags={"turn": "side"}, tools=tools, at=0)).dropped == "side_call"
    assert idx.observe(chat_record("e", [u("x")], "y", status="error", tools=tools, at=0)).dropped == "not_served"
    assert idx.observe(chat_record("m", [u("x")], "y", tags={"turn": "main"}, at=0)).dropped is None
    assert idx.observe(chat_record("k", [u("x")], "y", tools=tools, at=0)).dropped == "retry"  # same as "m"


def test_the_last_turn_expires_after_the_ttl_and_never_binds():
    idx = SessionIndex(ttl_s=10)
    idx.observe(chat_record("r1", [u("hi")], "hello", session="s", at=0))
    assert idx.expire(5.0 + idx.pending("tag:s").at) == []
    obs = idx.observe(chat_record("r2", [u("hi"), a("hello"), u("thanks")], "bye", session="s", at=11))
    assert [t.record_id for t in obs.expired] == ["r1"] and obs.bound == []   # a new session, nothing bound
    assert idx.pending("tag:s").record_id == "r2"


def test_ties_go_to_the_most_recently_active_session():
    def run(order):
        idx = SessionIndex(ttl_s=100)
        for at, rid in enumerate(order):
            if rid == "long":   # a conversation whose earlier turns went elsewhere (another server)
                idx.observe(chat_record("long", [u("hi"), a("hello"), u("more")], "sure", at=at))
            else:
                idx.observe(chat_record("short", [u("hi")], "hello", at=at))
        # extends both: [hi] + hello + ..., and [hi, hello, more] + sure + ...
        (bound,) = idx.observe(chat_record("next", [u("hi"), a("hello"), u("more"), a("sure"), u("ok")], "k",
                                           at=10)).bound
        return bound.turn.record_id

    assert run(["long", "short"]) == "short"
    assert run(["short", "long"]) == "long"


def test_the_open_session_cap_evicts_the_least_recently_active():
    idx = SessionIndex(ttl_s=100, max_open=2)
    idx.observe(chat_record("r1", [u("a")], "1", at=0))
    idx.observe(chat_record("r2", [u("b")], "2", at=1))
    obs = idx.observe(chat_record("r3", [u("c")], "3", at=2))
    assert [t.record_id for t in obs.expired] == ["r1"] and len(idx) == 2


def responses_record(rid, input_items, reply, *, at, instructions=None):
    """A served ``POST /v1/responses`` turn as the record store keeps it: the Responses body (the
    whole conversation as input items) and the Responses object."""
    from dataclasses import replace

    body = {"model": "m", "input": input_items, **({"instructions": instructions} if instructions else {})}
    record = chat_record(rid, [], reply, at=at)
    return replace(record, route="openai.responses", request=body, response={
        "object": "response", "output": [{"type": "message", "role": "assistant",
                                          "content": [{"type": "output_text", "text": reply}]}]})


def test_responses_route_turns_form_sessions_like_chat_turns():
    """Codex and the Agents SDK speak /v1/responses: their conversation is input items, the reply
    output items; trace matching and the next state read them as the conversation they are."""
    idx = SessionIndex(ttl_s=60)
    assert idx.observe(responses_record("r1", [u("what is 2+2?")], "4", at=0, instructions="be brief")).dropped is None
    items = [u("what is 2+2?"), {"type": "message", "role": "assistant",
                                  "content": [{"type": "output_text", "text": "4"}]}, u("no, say it in words")]
    (bound,) = idx.observe(responses_record("r2", items, "four", at=1, instructions="be brief")).bound
    assert (bound.turn.record_id, bound.next_state.role, bound.next_state.text) == ("r1", "user", "no, say it in words")
