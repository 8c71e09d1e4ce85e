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
