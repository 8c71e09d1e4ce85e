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
    assert out["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}, "effort": "high"}


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
    assert anthropic["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}, "effort": "low"}


@pytest.mark.parametrize("key", ["output_config", "output_format"])
def test_anthropic_structured_output_and_effort_reach_openai_and_responses_upstreams(key):
    fmt = {"type": "json_schema", "schema": SCHEMA}
    body = {"model": "m", "max_tokens": 9, "messages": USER,
            **({"output_config": {"format": fmt, "effort": "max"}} if key == "output_config"
               else {"output_format": fmt, "output_config": {"effort": "medium"}})}
    chat = translate_request(body, "anthropic", "openai")
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": SCHEMA}}
    assert chat["reasoning_effort"] == ("xhigh" if key == "output_config" else "medium")
    responses = translate_request(body, "anthropic", "responses")
    assert responses["text"]["format"]["schema"] == SCHEMA
    assert responses["reasoning"]["effort"] == chat["reasoning_effort"]
