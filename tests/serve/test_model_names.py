"""Model names: a request names a served model, a configured alias, or none; anything else is a
404 ``model_not_found`` in the client's dialect, before the runtime is called or a record written.

Served names come from the runtime (``Runtime.models()``); a runtime that lists none (the
``upstream`` runtime with neither ``model`` nor ``model_map``) passes every name through.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from reef_core.errors import ConfigError, ModelNotFound
from reef_core.kernel import Reef
from reef_core.plugins import get_plugins
from reef_core.runtime import Runtime
from reef_core.testing import ReefServer, reef_settings
from reef_core.types import InferenceCall

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
USER = [{"role": "user", "content": "hello"}]
ALIASES = "+runtime.model_aliases={gpt-4o-mini: big, claude-haiku-4-5: small}"


@pytest.fixture(scope="module")
def served(upstreams, tmp_path_factory):
    """A Reef whose upstream runtime serves ``big`` (its ``model``) and ``small`` (a ``model_map``
    name sent upstream as ``tiny``), with two aliases."""
    with ReefServer(tmp_path_factory.mktemp("served"), upstream=upstreams["openai"],
                    overrides=["runtime.model=big", "+runtime.model_map={small: tiny}", ALIASES]) as reef:
        yield reef


@pytest.fixture(scope="module")
def passthrough(upstreams, tmp_path_factory):
    """A Reef in front of an upstream whose models it cannot know (no ``model``, no ``model_map``)."""
    with ReefServer(tmp_path_factory.mktemp("passthrough"), upstream=upstreams["anthropic"],
                    overrides=["+runtime.model_aliases={house-model: claude-sonnet-4-5}"]) as reef:
        yield reef


def _records(reef) -> int:
    return len(reef.store.list_records("default", limit=1000))


def _openai_chat(reef, **body: Any):
    return reef.client().post("/v1/chat/completions", json={"messages": USER, **body})


def _anthropic_messages(reef, **body: Any):
    return reef.client().post("/v1/messages", json={"messages": USER, "max_tokens": 5, **body})


@pytest.mark.parametrize("streamed", [False, True])
def test_unknown_model_is_openai_model_not_found(served, upstreams, streamed):
    sent, stored = len(upstreams["openai"].requests), _records(served)
    r = _openai_chat(served, model="gpt-4o", stream=streamed)
    assert r.status_code == 404
    error = r.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "model", "model_not_found")
    assert "'gpt-4o'" in error["message"]
    assert "big, small, gpt-4o-mini, claude-haiku-4-5" in error["message"]
    assert len(upstreams["openai"].requests) == sent and _records(served) == stored


@pytest.mark.parametrize("streamed", [False, True])
def test_unknown_model_is_anthropic_not_found(served, upstreams, streamed):
    sent = len(upstreams["openai"].requests)
    r = _anthropic_messages(served, model="claude-opus-9", stream=streamed)
    assert r.status_code == 404
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert "'claude-opus-9'" in body["error"]["message"] and "big, small" in body["error"]["message"]
    assert len(upstreams["openai"].requests) == sent


def test_sdks_raise_their_not_found_errors(served):
    with pytest.raises(openai.NotFoundError) as oe:
        served.openai().chat.completions.create(model="gpt-4.1-nano", messages=USER)
    assert oe.value.code == "model_not_found" and oe.value.param == "model"
    with pytest.raises(anthropic.NotFoundError) as ae:
        served.anthropic().messages.create(model="claude-3-opus", max_tokens=5, messages=USER)
    assert "big" in str(ae.value)


def test_a_typo_in_a_served_name_is_refused(served):
    assert _openai_chat(served, model="Big").status_code == 404
    assert _openai_chat(served, model="").status_code == 404


def test_served_names_reach_the_runtime(served, upstreams):
    up = upstreams["openai"]
    assert _openai_chat(served, model="big").status_code == 200
    assert up.requests[-1]["model"] == "big"
    r = _anthropic_messages(served, model="small")
    assert r.status_code == 200 and up.requests[-1]["model"] == "tiny"  # the runtime's model_map still applies


@pytest.mark.parametrize(("alias", "served_name", "upstream_name"),
                         [("gpt-4o-mini", "big", "big"), ("claude-haiku-4-5", "small", "tiny")])
def test_alias_is_served_and_recorded_as_the_served_model(served, upstreams, alias, served_name, upstream_name):
    r = _openai_chat(served, model=alias)
    assert r.status_code == 200
    assert upstreams["openai"].requests[-1]["model"] == upstream_name
    record = served.store.get_record(r.headers["x-reef-agent-record-id"])
    assert record.request["model"] == served_name


def test_alias_works_when_streamed_and_in_the_other_dialect(served, upstreams):
    with served.anthropic().messages.stream(model="gpt-4o-mini", max_tokens=5, messages=USER) as stream:
        text = stream.get_final_text()
        receipt = stream.response.headers["x-reef-agent-record-id"]
    assert text == "echo: hello"
    assert upstreams["openai"].requests[-1]["model"] == "big"
    assert served.store.get_record(receipt).request["model"] == "big"


def test_missing_model_gets_the_runtime_default(served, upstreams):
    r = _openai_chat(served)
    assert r.status_code == 200 and upstreams["openai"].requests[-1]["model"] == "big"
    r = _anthropic_messages(served)
    assert r.status_code == 200 and upstreams["openai"].requests[-1]["model"] == "big"


def test_models_route_lists_served_names_then_aliases(served):
    expected = ["big", "small", "gpt-4o-mini", "claude-haiku-4-5"]
    assert [m.id for m in served.openai().models.list().data] == expected
    listed = served.client().get("/v1/models", headers={"anthropic-version": "2023-06-01"}).json()
    assert [m["id"] for m in listed["data"]] == expected
    assert (listed["first_id"], listed["last_id"]) == ("big", "claude-haiku-4-5")


def test_passthrough_upstream_accepts_any_name(passthrough, upstreams):
    up = upstreams["anthropic"]
    for name in ("claude-opus-9", "some/vendor-model:latest"):
        r = _openai_chat(passthrough, model=name)
        assert r.status_code == 200, r.text
        assert up.requests[-1]["model"] == name
        assert passthrough.store.get_record(r.headers["x-reef-agent-record-id"]).request["model"] == name
    r = _anthropic_messages(passthrough)
    assert r.status_code == 200


def test_passthrough_upstream_still_applies_aliases(passthrough, upstreams):
    r = _anthropic_messages(passthrough, model="house-model")
    assert r.status_code == 200
    assert upstreams["anthropic"].requests[-1]["model"] == "claude-sonnet-4-5"
    assert [m.id for m in passthrough.openai().models.list().data] == ["house-model"]


@pytest.mark.parametrize("example", ["quickstart_openai", "quickstart_anthropic"])
def test_quickstarts_use_the_first_served_model(example, served, upstreams):
    spec = importlib.util.spec_from_file_location(example, EXAMPLES / f"{example}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.main(served.url)
    assert out["record"]["request"]["model"] == "big" and upstreams["openai"].requests[-1]["model"] == "big"


# ---------------------------------------------------------------------- configuration


def _build(tmp_path, *overrides: str, runtime: Runtime | None = None) -> Reef:
    settings = reef_settings(tmp_path, ["runtime.upstream_url=http://127.0.0.1:9/v1", *overrides])
    return Reef(settings, get_plugins(), runtime=runtime)


@pytest.mark.parametrize(("overrides", "words"), [
    (["runtime.model=big", "+runtime.model_aliases={gpt-4o-mini: bigg}"], ["'gpt-4o-mini'", "'bigg'", "serves: big"]),
    (["+runtime.model_aliases=[gpt-4o-mini]"], ["must map client model names"]),
    (["+runtime.model_aliases={gpt-4o-mini: 5}"], ["runtime.model_aliases.gpt-4o-mini", "not 5"]),
    (["+runtime.model_aliases={gpt-4o-mini: null}"], ["runtime.model_aliases.gpt-4o-mini"]),
    (["+runtime.model_aliases='gpt-4o-mini=big'"], ["must map client model names"]),
])
def test_bad_aliases_are_one_line_config_errors(tmp_path, overrides, words):
    with pytest.raises(ConfigError) as err:
        _build(tmp_path, *overrides)
    message = str(err.value)
    assert "\n" not in message and message.startswith("runtime.model_aliases")
    for word in words:
        assert word in message


class LateNames(Runtime):
    """Learns its model's name at start, like an engine asked for its first model."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.closed = False

    async def start(self) -> None:
        self.name = "engine-model"

    def models(self) -> list[str]:
        return [self.name] if self.name else []

    async def complete(self, call: InferenceCall) -> dict[str, Any]:
        raise AssertionError("not called")

    async def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        raise AssertionError("not called")
        yield {}

    async def aclose(self) -> None:
        self.closed = True


def test_alias_targets_are_checked_at_start_when_names_come_late(tmp_path):
    runtime = LateNames()
    reef = _build(tmp_path, "+runtime.model_aliases={gpt-4o-mini: other-model}", runtime=runtime)
    with pytest.raises(ConfigError, match="'other-model'.*serves: engine-model"):
        asyncio.run(reef.start())
    assert not reef.started and runtime.closed  # a failed start leaves nothing running
    reef.store.close()


def test_late_names_are_enforced_once_started(tmp_path):
    reef = _build(tmp_path, "+runtime.model_aliases={gpt-4o-mini: engine-model}", runtime=LateNames())
    assert reef.model_names() == ["gpt-4o-mini"]  # before start the runtime names nothing yet

    async def started() -> None:
        await reef.start()
        try:
            assert reef.model_names() == ["engine-model", "gpt-4o-mini"]
            assert reef.resolve_model({"model": "gpt-4o-mini"}) == {"model": "engine-model"}
            body = {"messages": USER}
            assert reef.resolve_model(body) is body
            with pytest.raises(ModelNotFound, match="'nope'.*engine-model, gpt-4o-mini"):
                reef.resolve_model({"model": "nope"})
        finally:
            await reef.stop()

    asyncio.run(started())
