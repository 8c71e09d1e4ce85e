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
    """``rig(dialect, script, overrides=(), userinfo="")``: a raw upstream and a Reef in front of it
    (``userinfo``: ``user:password@`` in the upstream URL)."""
    made = []

    def make(dialect, script, overrides=(), userinfo=""):
        up = RawUpstream(script)
        made.append(up)
        url = up.url.replace("://", f"://{userinfo}", 1)
        reef = ReefServer(tmp_path / f"reef{len(made)}", upstream=url, dialect=dialect,
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


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("client", ["openai", "anthropic"])
@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
def test_an_upstream_quoting_its_key_does_not_pass_it_on(rig, client, upstream, stream):
    """"Incorrect API key provided: sk-…": the key reaches neither the client nor the record."""
    key = "sk-live-0123456789abcdef"
    message = f"Incorrect API key provided: {key}. Your key is {key[:6]}...{key[-4:]}"
    error = {"error": {"message": message, "type": "invalid_request_error", "code": key}} if upstream == "openai" \
        else {"type": "error", "error": {"type": "authentication_error", "message": message}}
    up, reef = rig(upstream, lambda path, body: [http(401, json.dumps(error).encode())],
                   overrides=[f"runtime.api_key={key}"])
    route, body = ROUTES[client]
    r = reef.client().post(route, json={**body, "stream": stream})
    assert r.status_code == 401 and "Incorrect API key provided: [redacted]" in r.text
    assert key not in r.text
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert record.status == "error" and "[redacted]" in record.error and key not in record.error
    sent = up.requests[0][1]
    assert key in (sent.get("authorization", "") + sent.get("x-api-key", ""))  # the upstream still gets it


def test_url_credentials_quoted_in_a_stream_error_are_redacted(rig):
    """Basic credentials (``user:password@`` in the URL) echoed in an in-stream error event."""
    def script(path, body):
        event = {"error": {"message": f"bad password s3cret-pass for {path}", "type": "auth"}}
        return [http(200, b"data: " + json.dumps(event).encode() + b"\n\n", ctype="text/event-stream")]

    up, reef = rig("openai", script, userinfo="user:s3cret-pass@")
    route, body = ROUTES["openai"]
    r = reef.client().post(route, json={**body, "stream": True})
    assert r.status_code == 502 and "s3cret-pass" not in r.text and "[redacted]" in r.text
    record = reef.wait_record(r.headers["x-reef-agent-record-id"])
    assert "s3cret-pass" not in record.error
    assert up.requests[0][1]["authorization"].startswith("Basic ")
