"""Fixtures for the serving tests: one fake upstream per dialect and one Reef in front of each."""

from __future__ import annotations

import pytest

from reef_core.testing import FakeUpstream, ReefServer, Reply, ToolCall, echo, tool_names, tool_results

# fake_upstream and reef_server come from reef-core's pytest11 plugin, as they would for any
# plugin author with reef-core installed.


def weather_responder(body):
    """Calls ``get_weather`` when offered and no result came back yet; then answers with the result."""
    results = tool_results(body)
    if results:
        return Reply(text=f"The weather is {results[-1]['content']}.")
    if "get_weather" in tool_names(body):
        return Reply(text="Let me check.", tool_calls=[ToolCall("get_weather", {"city": "Paris"})])
    return echo(body)


@pytest.fixture(scope="module")
def upstreams():
    """``{"openai": FakeUpstream, "anthropic": FakeUpstream}``, shared by a module."""
    with FakeUpstream("openai", weather_responder) as o, FakeUpstream("anthropic", weather_responder) as a:
        yield {"openai": o, "anthropic": a}


@pytest.fixture(scope="module")
def reefs(upstreams, tmp_path_factory):
    """``{"openai": ReefServer, "anthropic": ReefServer}``: a Reef in front of each fake upstream."""
    servers = {}
    try:
        for dialect, up in upstreams.items():
            servers[dialect] = ReefServer(tmp_path_factory.mktemp(f"reef-{dialect}"), upstream=up,
                                          overrides=["runtime.timeout_s=5"]).start()
        yield servers
    finally:
        for s in servers.values():
            s.stop()


@pytest.fixture(autouse=True)
def _reset_upstreams(request):
    """Controls set by one test (fail, hang, cut) never leak into the next."""
    yield
    if "upstreams" in request.fixturenames:
        for up in request.getfixturevalue("upstreams").values():
            up.reset()
