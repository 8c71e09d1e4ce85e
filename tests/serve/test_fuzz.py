"""Randomly malformed provider bodies never make Reef answer 5xx (seeded, so failures replay)."""

from __future__ import annotations

import random

import pytest
from responses_inputs import SCHEMA_PATHS, containing_minimal, has_type

from reef_core.serve.dialects.responses_schema import REQUEST
from reef_core.testing import ReefServer

JUNK = [None, 1, "x", [], {}, [1], ["a"], [{}], [{"type": "text"}], {"a": 1}, True, 1.5, [{"role": "user"}],
        [{"type": "tool_use"}], [{"type": "tool_result", "content": 3}], [{"type": "image_url", "image_url": 3}],
        [{"type": "function", "function": 3}], [{"name": "f", "input_schema": 1}], [{"id": "c", "function": "f"}]]


def _message(rng: random.Random):
    if rng.random() < 0.05:
        return rng.choice(JUNK)
    m = {"role": rng.choice(["user", "assistant", "system", "tool", "developer", 3, None]),
         "content": rng.choice(JUNK)}
    for key in ("tool_calls", "tool_call_id", "name", "function_call"):
        if rng.random() < 0.3:
            m[key] = rng.choice(JUNK)
    return m


def _body(rng: random.Random, anthropic: bool) -> dict:
    body = {"model": "m", "messages": [_message(rng) for _ in range(rng.randint(1, 4))]}
    if anthropic:
        body["max_tokens"] = 5
    for key in ("tools", "tool_choice", "stop", "system", "stop_sequences", "metadata", "stream_options", "n",
                "parallel_tool_calls", "user", "max_tokens", "temperature"):
        if rng.random() < 0.3:
            body[key] = rng.choice(JUNK)
    body["stream"] = rng.random() < 0.3
    return body


@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
def test_malformed_bodies_never_5xx(upstreams, tmp_path, upstream):
    rng = random.Random(1234)
    seen = set()
    with ReefServer(tmp_path, upstream=upstreams[upstream]) as reef, reef.client() as c:
        for _ in range(80):
            for path, anthropic in (("/v1/chat/completions", False), ("/v1/messages", True)):
                body = _body(rng, anthropic)
                r = c.post(path, json=body)
                seen.add(r.status_code)
                assert r.status_code < 500, (path, body, r.text)
                if r.status_code >= 400:
                    assert r.json()["error"]["message"]
    assert {200, 400} <= seen  # the generator exercises both outcomes


#: one JSON value of each type (and shapes that look like a field's own), for the schema walk below
WRONG = [[], {}, "x", 0, 1, 1.5, True, [1], ["a"], [{}], {"a": 1}, {"type": "function"}]


def _wrong_typed_bodies():
    """For every field of the Responses schema (array items and free-form values included), a
    well-typed body holding each JSON value of another type there: (body, the field's param)."""
    for path, schema in SCHEMA_PATHS:
        for leaf in WRONG:
            if not has_type(leaf, schema):
                body = containing_minimal(REQUEST, path, leaf)
                body.setdefault("input", "hi")
                yield body, ".".join(str(p) for p in path)


@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
def test_every_responses_field_of_a_wrong_type_is_a_400(upstreams, tmp_path, upstream):
    """Each field of ``POST /v1/responses``, one wrong type at a time: a 400 in OpenAI's shape
    naming the field, and nothing reaches the upstream."""
    before = len(upstreams[upstream].requests)
    failures, tried = [], 0
    with ReefServer(tmp_path, upstream=upstreams[upstream], log_level="critical") as reef, reef.client() as c:
        for stream in (False, True):
            for body, param in _wrong_typed_bodies():
                body = {**body, "stream": stream} if param != "stream" else body
                r = c.post("/v1/responses", json=body)
                tried += 1
                error = r.json().get("error") if r.headers.get("content-type") == "application/json" else None
                if r.status_code != 400 or not error or error.get("param") != param or \
                        set(error) != {"message", "type", "param", "code"}:
                    failures.append(f"{param}: {r.status_code} {r.text[:200]} for {body!r:.300}")
    assert not failures, f"{len(failures)} of {tried} failed:\n" + "\n".join(failures[:30])
    assert len(upstreams[upstream].requests) == before
    assert tried > 2 * len(SCHEMA_PATHS)
