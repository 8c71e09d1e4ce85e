"""Client mistakes are 4xx JSON in the route's shape; the server never answers 500 for them."""

from __future__ import annotations

import socket

import pytest

from reef_core.testing import ReefServer

CHAT = "/v1/chat/completions"
MSGS = "/v1/messages"


@pytest.fixture(scope="module")
def reef(upstreams, tmp_path_factory):
    with ReefServer(tmp_path_factory.mktemp("robust"), upstream=upstreams["openai"],
                    overrides=["server.max_body_bytes=4096"]) as server:
        yield server


def _shape(path, body):
    if path == MSGS:
        assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"]
    elif path == CHAT:
        assert set(body["error"]) == {"message", "type", "param", "code"}
    else:
        assert body["error"]["type"] and body["error"]["message"]


@pytest.mark.parametrize("path", [CHAT, MSGS, "/reef/report"])
@pytest.mark.parametrize("raw,status", [
    (b"{not json", 400), (b"", 400), (b"[1,2]", 400), (b'"text"', 400), (b"\xff\xfe", 400),
])
def test_malformed_bodies(reef, path, raw, status):
    r = reef.client().post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    _shape(path, r.json())


@pytest.mark.parametrize("path,body,param", [
    (CHAT, {"model": "m"}, "messages"),
    (CHAT, {"model": "m", "messages": []}, "messages"),
    (CHAT, {"model": "m", "messages": "hi"}, "messages"),
    (CHAT, {"model": 3, "messages": [{"role": "user", "content": "x"}]}, "model"),
    (CHAT, {"model": "m", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}, "stream"),
    (MSGS, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    (MSGS, {"model": "m", "max_tokens": True, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    # (a system message inside `messages` is accepted: Claude Code 2.1 sends them mid-conversation)
    (MSGS, {"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
])
def test_wrong_fields(reef, path, body, param):
    r = reef.client().post(path, json=body)
    assert r.status_code == 400, r.text
    _shape(path, r.json())
    assert param in r.json()["error"]["message"]


def test_bad_scenario_header(reef):
    r = reef.client().post(CHAT, json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                           headers={"x-reef-scenario": "../etc/passwd"})
    assert r.status_code == 400 and "scenario" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", [CHAT, MSGS, "/reef/report"])
def test_oversized_body_413(reef, path):
    r = reef.client().post(path, content=b"x" * 5000, headers={"content-type": "application/json"})
    assert r.status_code == 413
    _shape(path, r.json())
    assert "max_body_bytes" in r.json()["error"]["message"] if path != MSGS else r.json()["error"]["message"]


def test_oversized_chunked_body_413(reef):
    def gen():
        for _ in range(10):
            yield b"y" * 1000

    r = reef.client().post(CHAT, content=gen(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    _shape(CHAT, r.json())


def test_unknown_route_and_method(reef):
    r = reef.client().get("/nope")
    assert r.status_code == 404 and "/nope" in r.json()["error"]["message"]
    r = reef.client().get(CHAT)
    assert r.status_code == 405
    _shape(CHAT, r.json())
    r = reef.client().delete("/reef/report")
    assert r.status_code == 405 and r.json()["error"]["type"] == "method_not_allowed"


def test_bad_query_params_422(reef):
    r = reef.client().get("/reef/scenarios/default/records", params={"limit": 0})
    assert r.status_code == 422 and "limit" in r.json()["error"]["message"]
    r = reef.client().get("/reef/scenarios/default/records", params={"cursor": "garbage!!"})
    assert r.status_code == 400 and "cursor" in r.json()["error"]["message"]
    r = reef.client().get("/reef/scenarios/default/records", params={"since": "yesterday"})
    assert r.status_code == 422


def test_garbage_http_does_not_kill_server(reef):
    host, port = reef.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"NONSENSE / HTTP/9.9\r\n\r\n")
        s.recv(1024)
    assert reef.client().get("/healthz").status_code == 200


def test_openapi_describes_every_route(reef):
    spec = reef.client().get("/openapi.json").json()
    paths = spec["paths"]
    for p in ["/v1/chat/completions", "/v1/messages", "/v1/models", "/reef/report", "/reef/scenarios",
              "/reef/scenarios/{scenario}", "/reef/scenarios/{scenario}/records", "/reef/records/{record_id}",
              "/healthz", "/readyz", "/metrics"]:
        assert p in paths, p
    assert "messages" in paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"][
        "schema"]["required"]
    assert "references" in paths["/reef/report"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "properties"]


def test_error_answers_are_counted(reef):
    reef.client().post(CHAT, content=b"{", headers={"content-type": "application/json"})
    reef.client().get("/nope")
    text = reef.client().get("/metrics").text
    assert 'reef_http_errors_total{status="400"}' in text and 'reef_http_errors_total{status="404"}' in text
