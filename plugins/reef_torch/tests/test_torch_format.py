"""Request validation, response shapes and adapter bookkeeping (no model needed)."""

from __future__ import annotations

import pytest

from reef_core import ActiveRelease, RuntimeCallError, base_release
from reef_core.kit import AdapterTable
from reef_torch.engine import _safe_prefix_len
from reef_torch.openai_format import completion_body, parse_chat_request

USER = [{"role": "user", "content": "hi"}]


def test_defaults_and_normalization():
    p = parse_chat_request(
        {"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, *USER]}
    )
    assert p.messages[0] == {"role": "system", "content": "ab"}
    assert (p.temperature, p.top_p, p.max_tokens, p.stop, p.seed, p.stream) == (1.0, 1.0, None, [], None, False)


def test_max_completion_tokens_and_stop_string():
    p = parse_chat_request({"messages": USER, "max_tokens": 50, "max_completion_tokens": 7, "stop": "\n"})
    assert p.max_tokens == 7 and p.stop == ["\n"]


def test_top_k_and_min_p_as_sglang_takes_them():
    p = parse_chat_request({"messages": USER, "top_k": 20, "min_p": 0.05})
    assert (p.top_k, p.min_p) == (20, 0.05)
    assert parse_chat_request({"messages": USER}).top_k == 0
    assert parse_chat_request({"messages": USER, "top_k": -1}).top_k == 0  # -1 and 0: no limit
    assert parse_chat_request({"messages": USER, "repetition_penalty": 1.0}).top_k == 0


def test_what_does_not_bind_the_answer_passes():
    for extra in ({"response_format": {"type": "text"}}, {"tool_choice": "auto"}, {"tool_choice": "none"},
                  {"user": "u", "metadata": {"a": "b"}}):
        assert parse_chat_request({"messages": USER, **extra}).messages == USER


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"n": 2}, "n"),
        ({"n": True}, "n"),
        ({"temperature": 3}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": "9"}, "max_completion_tokens"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"seed": 1.5}, "seed"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"repetition_penalty": 1.2}, "repetition_penalty"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_p": "0.1"}, "min_p"),
        ({"logit_bias": {"1": 3}}, "logit_bias"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"stream": "yes"}, "stream"),
    ],
)
def test_invalid_parameters_are_400_in_openai_shape(extra, param):
    with pytest.raises(RuntimeCallError) as info:
        parse_chat_request({"messages": USER, **extra})
    err = info.value
    assert err.status == 400
    assert err.body["error"]["type"] == "invalid_request_error"
    assert err.body["error"]["param"] == param
    assert err.body["error"]["message"]


@pytest.mark.parametrize(
    "messages",
    [
        None,
        [],
        [{"role": "robot", "content": "x"}],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
    ],
)
def test_bad_messages(messages):
    with pytest.raises(RuntimeCallError) as info:
        parse_chat_request({"messages": messages})
    assert info.value.status == 400


def test_completion_body_shape():
    body = completion_body(
        completion_id="chatcmpl-x", model="m", text="hi", finish_reason="stop", prompt_tokens=3, completion_tokens=2
    )
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_stream_holds_back_possible_stop_prefix_and_partial_utf8():
    assert _safe_prefix_len("hello wo", ["world"]) == len("hello ")
    assert _safe_prefix_len("hello", ["xyz"]) == 5
    assert _safe_prefix_len("ab\ufffd", []) == 2


def test_adapter_table_switch_and_drain():
    t = AdapterTable()
    base = t.acquire("s")
    assert base.adapter is None
    assert t.activate("s", "r1", "s@r1") == []
    v1 = t.acquire("s")
    assert v1.adapter == "s@r1"
    assert t.release(base) == []  # base never needs unloading
    assert t.activate("s", "r2", "s@r2") == []  # r1 still held by a request
    assert t.is_loaded("s@r1")
    assert t.acquire("s").adapter == "s@r2"
    assert t.release(v1) == ["s@r1"]  # last hold gone: unload now
    assert not t.is_loaded("s@r1")


def test_adapter_table_honours_frozen_release_while_resident():
    t = AdapterTable()
    t.activate("s", "r1", "s@r1")
    held = t.acquire("s")
    t.activate("s", "r2", "s@r2")
    r1 = ActiveRelease(scenario="s", release_id="r1")
    frozen = t.hold_for_call("s", r1)
    assert frozen.adapter == "s@r1"  # still draining: the record's release wins
    assert t.release(held) == []
    assert t.release(frozen) == ["s@r1"]
    assert t.hold_for_call("s", r1) is None  # gone: the runtime must load it for this call
    assert t.hold_for_call("s", None).adapter == "s@r2"  # no release on the call: the serving one


def test_adapter_table_retired_unused_version_unloads_at_once_and_scenarios_are_separate():
    t = AdapterTable()
    t.activate("a", "r1", "a@r1")
    t.activate("b", "r1", "b@r1")
    assert t.activate("a", "r2", None) == ["a@r1"]
    assert t.acquire("a").adapter is None
    assert t.acquire("b").adapter == "b@r1"


def test_adapter_table_holds_the_base_for_a_call_frozen_before_the_first_release():
    """A request that started before anything was published records no release; it must run on
    the base even when the first release is swapped in before the runtime takes it up."""
    t = AdapterTable()
    first = t.hold_for_call("s", base_release("s"))
    assert first.adapter is None and t.active("s") is first  # nothing activated: the base serves
    assert t.activate("s", "r1", "s@r1") == []
    assert t.release(first) == []
    late = t.hold_for_call("s", base_release("s"))
    assert late.adapter is None and t.active("s").adapter == "s@r1"  # the scenario keeps its adapter
    assert t.release(late) == []  # the base never needs unloading
    assert t.hold_for_call("s", None).adapter == "s@r1"
    assert t.snapshot()["_draining"] == {}  # the base's hold left nothing behind
