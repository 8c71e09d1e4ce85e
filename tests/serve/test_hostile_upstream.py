"""A hostile or broken upstream, byte for byte (``raw_upstream.RawUpstream``): the client gets an
answer or an error in its own dialect, and the record says truthfully what happened."""

from __future__ import annotations

import json

import pytest
from raw_upstream import RawUpstream, http

from reef_core.testing import ReefServer

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MSG = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
RESP = {"model": "m", "input": "hi"}
ROUTES = {"openai": ("/v1/chat/completions", CHAT), "anthropic": ("/v1/messages", MSG),
          "responses": ("/v1/responses", RESP)}


@pytest.fixture
def rig(tmp_path):
    """``rig(dialect, script, overrides=())``: a raw upstream and a Reef in front of it."""
    made = []

    def make(dialect, script, overrides=()):
        up = RawUpstream(script)
        made.append(up)
        reef = ReefServer(tmp_path / f"reef{len(made)}", upstream=up.url, dialect=dialect,
                          overrides=["runtime.timeout_s=5", *overrides]).start()
        made.append(reef)
        return up, reef

    yield make
    for thing in reversed(made):
        thing.stop() if isinstance(thing, ReefServer) else thing.close()


@pytest.mark.parametrize("client", ["openai", "anthropic", "responses"])
@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
def test_an_error_object_answered_with_200_is_an_error(rig, client, upstream):
    """Some gateways answer an error with status 200: that is no (empty) answer recorded as ok."""
    error = {"error": {"message": "quota exhausted", "type": "insufficient_quota"}} if upstream == "openai" else \
        {"type": "error", "error": {"type": "overloaded_error", "message": "quota exhausted"}}
    _, reef = rig(upstream, lambda path, body: [http(200, json.dumps(error).encode())])
    route, body = ROUTES[client]
    r = reef.client().post(route, json=body)
    assert r.status_code == 502
    err = r.json()
    message = err["error"]["message"]
    assert "quota exhausted" in message and (err.get("type") == "error") == (client == "anthropic")
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "error" and "quota exhausted" in record.error
