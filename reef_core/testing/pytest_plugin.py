"""pytest fixtures for Reef plugin and recipe authors.

Loaded automatically wherever reef-core is installed (its ``pytest11`` entry point).
Everything started is stopped at the end of the test.

    def test_my_recipe(fake_upstream, reef_server):
        up = fake_upstream("openai", lambda body: "42")
        reef = reef_server(upstream=up, overrides=["recipe=my_recipe"])
        r = reef.openai().chat.completions.with_raw_response.create(model="m", messages=[...])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .fake_upstream import FakeUpstream
from .reef_server import ReefServer


@pytest.fixture
def fake_upstream() -> Callable[..., FakeUpstream]:
    """A factory: ``fake_upstream(dialect="openai", responder=None, **kw)`` -> a started FakeUpstream."""
    started: list[FakeUpstream] = []

    def make(dialect: str = "openai", responder: Any = None, **kwargs: Any) -> FakeUpstream:
        up = FakeUpstream(dialect, responder, **kwargs).start()
        started.append(up)
        return up

    yield make
    for up in reversed(started):
        up.close()


@pytest.fixture
def reef_server(tmp_path) -> Callable[..., ReefServer]:
    """A factory: ``reef_server(overrides=(), upstream=..., tokens=..., runtime=...)`` -> a started
    ReefServer whose state lives under the test's ``tmp_path``."""
    started: list[ReefServer] = []

    def make(overrides: Any = (), **kwargs: Any) -> ReefServer:
        server = ReefServer(tmp_path / f"reef-{len(started)}", overrides, **kwargs).start()
        started.append(server)
        return server

    yield make
    for server in reversed(started):
        server.stop()
