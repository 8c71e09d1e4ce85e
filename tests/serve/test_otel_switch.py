"""FastAPI's native OpenTelemetry support: on when a provider is configured at start, else off."""

from __future__ import annotations

import inspect

import pytest
from fastapi import FastAPI

from reef_core.serve.app import telemetry_options

pytestmark = pytest.mark.skipif("telemetry" not in inspect.signature(FastAPI.__init__).parameters,
                                reason="this FastAPI has no native telemetry")


def test_off_when_no_provider_is_configured():
    assert telemetry_options() == {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def test_left_to_fastapi_when_a_tracer_provider_is_configured(monkeypatch):
    from opentelemetry import trace

    class ConfiguredProvider(trace.TracerProvider):
        def get_tracer(self, *args, **kwargs):  # noqa: ANN002, ANN003
            return trace.NoOpTracer()

    monkeypatch.setattr(trace, "get_tracer_provider", lambda: ConfiguredProvider())
    assert telemetry_options() == {}


def test_the_served_app_skips_the_per_request_check(reef_server, fake_upstream, monkeypatch):
    from opentelemetry import trace

    server = reef_server(upstream=fake_upstream())
    assert server.app._telemetry["tracing"] is False
    asked = []
    real = trace.get_tracer_provider
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: asked.append(1) or real())
    r = server.client().post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and asked == []


def _count_server_error_middleware(monkeypatch) -> list[tuple[object, str]]:
    """(app, path) of each HTTP request Starlette's outermost middleware sees (the fake
    upstream is a Starlette app too)."""
    from starlette.middleware.errors import ServerErrorMiddleware

    seen: list[tuple[object, str]] = []
    real = ServerErrorMiddleware.__call__

    async def counting(self, scope, receive, send):
        if scope["type"] == "http":
            seen.append((scope["app"], scope["path"]))
        await real(self, scope, receive, send)

    monkeypatch.setattr(ServerErrorMiddleware, "__call__", counting)
    return seen


def test_without_telemetry_inference_is_taken_before_fastapis_stack(reef_server, fake_upstream, monkeypatch):
    seen = _count_server_error_middleware(monkeypatch)
    server = reef_server(upstream=fake_upstream())
    client = server.client()
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert client.get("/v1/models").status_code == 200
    assert [path for app, path in seen if app is server.app] == ["/v1/models"]
    # the body-size guard still answers for both kinds of route
    big = b"x" * (server.reef.settings.server.max_body_bytes + 1)
    for path in ("/v1/chat/completions", "/reef/report"):
        assert client.post(path, content=big, headers={"content-type": "application/json"}).status_code == 413


def test_with_telemetry_inference_goes_through_fastapis_stack(reef_server, fake_upstream, monkeypatch):
    from opentelemetry import trace

    class ConfiguredProvider(trace.TracerProvider):
        def get_tracer(self, *args, **kwargs):  # noqa: ANN002, ANN003
            return trace.NoOpTracer()

    monkeypatch.setattr(trace, "get_tracer_provider", lambda: ConfiguredProvider())
    seen = _count_server_error_middleware(monkeypatch)
    server = reef_server(upstream=fake_upstream())
    assert server.app.entry is None
    r = server.client().post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert r.headers["x-reef-agent-record-id"]
    assert [path for app, path in seen if app is server.app] == ["/v1/chat/completions"]


def test_middleware_added_later_sees_the_inference_routes_too(tmp_path, fake_upstream):
    from reef_core.testing import ReefServer

    seen: list[str] = []

    async def tag(request, call_next):
        seen.append(request.url.path)
        response = await call_next(request)
        response.headers["x-added-later"] = "yes"
        return response

    reef = ReefServer(tmp_path / "state", upstream=fake_upstream())
    assert reef.app.entry is not None
    reef.app.middleware("http")(tag)
    assert reef.app.entry is None
    with reef:
        client = reef.client()
        r = client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.headers["x-added-later"] == "yes" and r.headers["x-reef-agent-record-id"]
        big = b"x" * (reef.settings.server.max_body_bytes + 1)
        r = client.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.headers["x-added-later"] == "yes"  # the guard sits under it, as before
    assert seen == ["/v1/chat/completions", "/v1/chat/completions"]
