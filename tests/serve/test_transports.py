"""The upstream runtime behaves the same on every HTTP transport (Reef's own, aiohttp's pool and httpx's)."""

from __future__ import annotations

import pytest
from scripted import Scripted, ThreadedScript, answer, gzip_bomb

from reef_core.builtins.upstream import UpstreamRuntime
from reef_core.errors import RuntimeCallError, RuntimeUnavailable
from reef_core.serve import http_transport
from reef_core.testing import FakeUpstream, ReefServer, parse_sse
from reef_core.types import InferenceCall

TRANSPORTS = ["http1", "httpx"] + (["aiohttp"] if http_transport.available() else [])
BODY = {"model": "m", "messages": [{"role": "user", "content": "a b c d e f"}]}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_runtime_on_each_transport(transport):
    with FakeUpstream("openai") as up:
        rt = UpstreamRuntime(upstream_url=up.url + "/v1", http_transport=transport, timeout_s=0.5, api_key="k")
        assert rt.http_transport == transport
        await rt.start()
        try:
            out = await rt.complete(InferenceCall("s", "r", BODY))
            assert out["choices"][0]["message"]["content"] == "echo: a b c d e f"
            assert up.headers[-1]["authorization"] == "Bearer k"
            events = [e async for e in rt.stream(InferenceCall("s", "r", {**BODY, "stream": True}))]
            assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) \
                == "echo: a b c d e f"
            up.fail(418, "teapot")
            with pytest.raises(RuntimeCallError) as err:
                await rt.complete(InferenceCall("s", "r", BODY))
            assert err.value.status == 418 and "teapot" in str(err.value)
            up.cut_stream(after_events=3)
            with pytest.raises(RuntimeCallError):
                async for _ in rt.stream(InferenceCall("s", "r", {**BODY, "stream": True})):
                    pass
            up.hang(times=1)
            with pytest.raises(RuntimeUnavailable, match="timed out"):
                await rt.complete(InferenceCall("s", "r", BODY))
            up.release()
        finally:
            await rt.aclose()


async def test_runtime_not_configured_is_clear():
    rt = UpstreamRuntime()
    assert "upstream_url" in rt.config_problem()
    await rt.start()
    with pytest.raises(RuntimeCallError, match="upstream_url") as err:
        await rt.complete(InferenceCall("s", "r", BODY))
    assert err.value.status == 503


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_answer_past_max_response_bytes_is_a_502_naming_it_on_each_transport(transport, stream):
    bomb = gzip_bomb(256)  # about 256 KB that inflates to 256 MiB

    async def bombing(reader, writer, n):
        kind = "text/event-stream" if stream else "application/json"
        writer.write(answer(bomb, headers=f"content-type: {kind}\r\ncontent-encoding: gzip\r\n"))

    async with Scripted(bombing) as server:
        rt = UpstreamRuntime(upstream_url=f"http://127.0.0.1:{server.port}/v1", http_transport=transport,
                             max_response_bytes=1 << 20)
        await rt.start()
        try:
            with pytest.raises(RuntimeCallError, match=r"runtime\.max_response_bytes \(1048576 bytes") as err:
                if stream:
                    async for _ in rt.stream(InferenceCall("s", "r", {**BODY, "stream": True})):
                        pass
                else:
                    await rt.complete(InferenceCall("s", "r", BODY))
            assert err.value.status == 502
        finally:
            await rt.aclose()


def test_the_client_of_a_too_large_answer_gets_a_502_naming_the_limit(tmp_path):
    def large(sock, n):
        sock.sendall(answer(b'{"id":"x","choices":[],"pad":"' + b"a" * 8192 + b'"}'))

    with ThreadedScript(large) as up, ReefServer(tmp_path, upstream=up.url.rsplit("/v1", 1)[0] + "/v1",
                                                 overrides=["runtime.max_response_bytes=4096"]) as reef:
        r = reef.client().post("/v1/chat/completions", json=BODY)
        assert r.status_code == 502 and "runtime.max_response_bytes" in r.json()["error"]["message"]


def test_runtime_rejects_bad_options():
    with pytest.raises(ValueError, match="dialect"):
        UpstreamRuntime(upstream_url="http://x", dialect="cohere")
    with pytest.raises(ValueError, match="http"):
        UpstreamRuntime(upstream_url="ftp://x")
    with pytest.raises(ValueError, match="http_transport"):
        UpstreamRuntime(upstream_url="http://x", http_transport="curl")
    for bad in (0, -1, "64MiB", True):
        with pytest.raises(ValueError, match="max_response_bytes"):
            UpstreamRuntime(upstream_url="http://x", max_response_bytes=bad)


def test_model_override_and_map(tmp_path):
    with FakeUpstream("anthropic") as up, ReefServer(
            tmp_path, upstream=up, overrides=["runtime.model=big", "+runtime.model_map={small: tiny}"]) as reef:
        r = reef.client().post("/v1/messages", json={"model": "small", "max_tokens": 5, "stream": True,
                                                     "messages": [{"role": "user", "content": "x"}]})
        assert up.requests[-1]["model"] == "tiny"
        assert parse_sse(r.text)[-1][1]["type"] == "message_stop"
        sent = len(up.requests)
        other = reef.client().post("/v1/messages", json={"model": "other", "max_tokens": 5,
                                                         "messages": [{"role": "user", "content": "x"}]})
        assert other.status_code == 404 and len(up.requests) == sent  # not served: never rewritten to `model`
        reef.client().post("/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
        assert up.requests[-1]["model"] == "big"
        reef.client().post("/v1/messages", json={"model": "big", "max_tokens": 5,
                                                 "messages": [{"role": "user", "content": "x"}]})
        assert up.requests[-1]["model"] == "big"
        assert sorted(m.id for m in reef.openai().models.list().data) == ["big", "small"]


async def test_anthropic_upstream_gets_its_auth_headers():
    with FakeUpstream("anthropic", api_key="sk-ant") as up:
        rt = UpstreamRuntime(upstream_url=up.url, dialect="anthropic", api_key="sk-ant")
        await rt.start()
        try:
            out = await rt.complete(InferenceCall("s", "r", {"model": "m", "max_tokens": 5, "messages": [
                {"role": "user", "content": "q"}]}))
            assert out["content"][0]["text"] == "echo: q"
            assert up.headers[-1]["x-api-key"] == "sk-ant" and up.headers[-1]["anthropic-version"]
            assert "authorization" not in up.headers[-1]
        finally:
            await rt.aclose()
        wrong = UpstreamRuntime(upstream_url=up.url, dialect="anthropic", api_key="nope")
        await wrong.start()
        try:
            with pytest.raises(RuntimeCallError) as err:
                await wrong.complete(InferenceCall("s", "r", {"model": "m", "max_tokens": 5, "messages": []}))
            # Reef's own key refused: a 502 naming it (a 401 would read as the client's key refused)
            assert err.value.status == 502 and "refused Reef's own credentials with 401" in str(err.value)
        finally:
            await wrong.aclose()
