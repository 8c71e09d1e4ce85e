"""The sglang runtime in front of several engines (``engine_urls``): adapter loads fan out to
every engine and count only when all took them; requests go round-robin over the engines or
through a router (``base_url``). Contract-tested against fake engines of both wire protocols."""

from __future__ import annotations

import asyncio
import itertools
import socket
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from fake_engine import BASE, FakeEngine, ServerThread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from reef_core import ActiveRelease, InferenceCall, RuntimeCallError, RuntimeUnavailable
from reef_sglang import SGLangRuntime


def call(text="hello", scenario="s"):
    return InferenceCall(scenario=scenario, record_id="r",
                         body={"model": "whatever", "messages": [{"role": "user", "content": text}]})


def release(tmp_path: Path, release_id: str, scenario: str = "s") -> ActiveRelease:
    path = tmp_path / f"{scenario}-{release_id}"
    (path / "adapter").mkdir(parents=True, exist_ok=True)
    (path / "adapter" / "adapter_config.json").write_text('{"r": 8}')
    return ActiveRelease(scenario=scenario, release_id=release_id, path=path)


def chats(engine):
    return [body for kind, body in engine.calls if kind == "chat"]


@pytest.fixture(params=["sglang", "vllm"])
def engines(request):
    """Three fake engines of one flavor, started."""
    fakes = [FakeEngine(request.param) for _ in range(3)]
    with ExitStack() as stack:
        for fake in fakes:
            fake.url = stack.enter_context(ServerThread(fake.app))
        yield fakes


def router_app(engines: list[FakeEngine]) -> FastAPI:
    """What an ``sglang-router`` does for chat: forward each request to one engine in turn."""
    app = FastAPI()
    turn = itertools.cycle(engines)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": BASE, "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(req: Request):
        async with httpx.AsyncClient() as client:
            resp = await client.post(f"{next(turn).url}/v1/chat/completions", json=await req.json())
        return JSONResponse(resp.json(), status_code=resp.status_code)

    return app


@pytest.mark.asyncio
async def test_adapters_load_on_every_engine_and_requests_go_round_robin(engines, tmp_path):
    rt = SGLangRuntime(engine_urls=[e.url for e in engines], flavor=engines[0].flavor)
    await rt.start()
    try:
        assert rt.models() == [BASE] and rt.engine_urls == [e.url for e in engines]
        await rt.activate(release(tmp_path, "r1"))
        assert all(set(e.loaded) == {"s@r1"} for e in engines)
        answers = [await rt.complete(call(str(i))) for i in range(6)]
        assert [a["choices"][0]["message"]["content"] for a in answers] == [f"s@r1: {i}" for i in range(6)]
        assert [len(chats(e)) for e in engines] == [2, 2, 2]
        await rt.activate(release(tmp_path, "r2"))
        assert all(set(e.loaded) == {"s@r2"} for e in engines), "the old version is unloaded everywhere"
    finally:
        await rt.aclose()


@pytest.mark.asyncio
async def test_a_load_one_engine_refuses_serves_nowhere_and_the_old_release_stays(engines, tmp_path):
    rt = SGLangRuntime(engine_urls=[e.url for e in engines], flavor=engines[0].flavor)
    await rt.start()
    try:
        await rt.activate(release(tmp_path, "r1"))
        engines[1].refuse_loads = "out of memory for LoRA weights"
        with pytest.raises(RuntimeCallError, match=rf"engine at {engines[1].url} refused to load adapter 's@r2'.*"
                                                   "out of memory"):
            await rt.activate(release(tmp_path, "r2"))
        assert all(set(e.loaded) == {"s@r1"} for e in engines), "r2 must be on no engine, r1 on all"
        assert rt.serving()["s"]["release_id"] == "r1"
        answers = [await rt.complete(call(str(i))) for i in range(3)]
        assert {a["choices"][0]["message"]["content"].split(":")[0] for a in answers} == {"s@r1"}
        engines[1].refuse_loads = None
        await rt.activate(release(tmp_path, "r2"))  # the follower's retry, once the engine can load it
        assert all(set(e.loaded) == {"s@r2"} for e in engines)
    finally:
        await rt.aclose()


@pytest.mark.asyncio
async def test_behind_a_router_requests_go_through_it_and_loads_to_each_engine(engines, tmp_path):
    with ServerThread(router_app(engines)) as router:
        rt = SGLangRuntime(base_url=router, engine_urls=[e.url for e in engines], flavor=engines[0].flavor)
        await rt.start()
        try:
            await rt.activate(release(tmp_path, "r1"))
            assert all(set(e.loaded) == {"s@r1"} for e in engines)
            for i in range(3):
                assert (await rt.complete(call(str(i))))["choices"][0]["message"]["content"] == f"s@r1: {i}"
            assert [len(chats(e)) for e in engines] == [1, 1, 1]
        finally:
            await rt.aclose()


@pytest.mark.asyncio
async def test_an_engine_refusing_connections_is_skipped_for_requests_and_fails_loads(engines, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    rt = SGLangRuntime(engine_urls=[engines[0].url, dead], flavor=engines[0].flavor, model=BASE, connect_timeout_s=2)
    try:
        for i in range(4):
            assert (await rt.complete(call(str(i))))["choices"][0]["message"]["content"] == f"base: {i}"
        assert len(chats(engines[0])) == 4
        with pytest.raises(RuntimeUnavailable, match="Cannot reach"):
            await rt.activate(release(tmp_path, "r1"))
        assert engines[0].loaded == {}, "a load that missed one engine is taken back from the others"
    finally:
        await rt.aclose()


@pytest.mark.asyncio
async def test_engines_must_serve_the_same_base(engines):
    engines[2].model = "other/model"
    rt = SGLangRuntime(engine_urls=[e.url for e in engines], flavor=engines[0].flavor)
    try:
        with pytest.raises(RuntimeUnavailable, match=rf"engine at {engines[2].url} does not serve 'fake/base-model'"):
            await rt.start()
    finally:
        await rt.aclose()


def test_engine_options_are_checked():
    with pytest.raises(ValueError, match="admin_url is for one engine"):
        SGLangRuntime(engine_urls=["http://a:1", "http://b:1"], admin_url="http://c:1")
    with pytest.raises(ValueError, match="lists an engine twice"):
        SGLangRuntime(engine_urls=["http://a:1", "http://a:1"])
    with pytest.raises(ValueError, match="runtime.engine_urls carries credentials"):
        SGLangRuntime(engine_urls=["http://u:p@a:1"], api_key="k")
    rt = SGLangRuntime(engine_urls=["http://u:secret@a:1", "http://b:1"])
    assert rt.engine_urls == ["http://a:1", "http://b:1"] and rt.base_url == "http://a:1"
    assert SGLangRuntime().base_url == "http://127.0.0.1:30000"


@pytest.mark.asyncio
async def test_two_reef_servers_share_the_engines(engines, tmp_path):
    """Each server's runtime loads the release it follows; the second finds it loaded already."""
    one, two = (SGLangRuntime(engine_urls=[e.url for e in engines], flavor=engines[0].flavor) for _ in range(2))
    try:
        for rt in (one, two):
            await rt.start()
            await rt.activate(release(tmp_path, "r1"))
        assert all(set(e.loaded) == {"s@r1"} for e in engines)
        assert (await two.complete(call()))["choices"][0]["message"]["content"] == "s@r1: hello"
    finally:
        await one.aclose()
        await two.aclose()


def test_concurrent_activations_keep_engines_identical(engines, tmp_path):
    async def run():
        rt = SGLangRuntime(engine_urls=[e.url for e in engines], flavor=engines[0].flavor)
        await rt.start()
        try:
            await asyncio.gather(*(rt.activate(release(tmp_path, f"r{i}", scenario=f"s{i}")) for i in range(4)))
        finally:
            await rt.aclose()

    asyncio.run(run())
    assert all(set(e.loaded) == {f"s{i}@r{i}" for i in range(4)} for e in engines)
