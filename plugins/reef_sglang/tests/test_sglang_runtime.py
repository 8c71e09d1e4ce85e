"""The sglang runtime against a fake SGLang / vLLM server (both wire protocols)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import socket
from pathlib import Path

import pytest
import yaml
from fake_engine import BASE

from reef_core import ActiveRelease, InferenceCall, RuntimeCallError, RuntimeUnavailable
from reef_sglang import SGLangRuntime
from reef_sglang import plugin as sglang_plugin


def call(text="hello", scenario="s", **body):
    return InferenceCall(
        scenario=scenario, record_id="r", body={"model": "whatever", "messages": [{"role": "user", "content": text}], **body}
    )


def make_release(tmp_path: Path, scenario: str, release_id: str, adapter: bool = True) -> ActiveRelease:
    path = tmp_path / f"{scenario}-{release_id}"
    (path / ("adapter" if adapter else "harness")).mkdir(parents=True)
    if adapter:
        (path / "adapter" / "adapter_config.json").write_text('{"r": 8}')
    return ActiveRelease(scenario=scenario, release_id=release_id, path=path)


@pytest.fixture
async def runtime(engine):
    rt = SGLangRuntime(base_url=engine.url, flavor=engine.flavor)
    await rt.start()
    yield rt
    await rt.aclose()


def chats(engine):
    return [body for kind, body in engine.calls if kind == "chat"]


@pytest.mark.asyncio
async def test_pass_through_discovers_model_and_captures_tokens(engine, runtime):
    assert runtime.models() == [BASE]
    c = call()
    out = await runtime.complete(c)
    assert out["object"] == "chat.completion" and out["model"] == BASE
    assert out["choices"][0]["message"]["content"] == "base: hello"
    # Reef asked for logprobs and token ids; the client did not, so it does not see them
    assert out["choices"][0]["logprobs"] is None
    assert "token_ids" not in out["choices"][0] and "prompt_token_ids" not in out
    sent = chats(engine)[-1]
    assert sent["logprobs"] is True and sent["return_token_ids"] is True and sent["model"] == BASE
    assert "lora_path" not in sent
    assert c.extras["adapter"] is None
    assert c.extras["prompt_token_ids"] == [ord(ch) for ch in "hello"]
    assert c.extras["response_token_ids"] == [ord(ch) for ch in "base: hello"]
    assert c.extras["logprobs"] == pytest.approx([-0.01 * i for i in range(len("base: hello"))])


@pytest.mark.asyncio
async def test_client_asked_logprobs_keeps_them(runtime):
    out = await runtime.complete(call(logprobs=True))
    assert len(out["choices"][0]["logprobs"]["content"]) == len("base: hello")


@pytest.mark.asyncio
async def test_adapter_per_scenario_selected_the_engine_way(engine, runtime, tmp_path):
    r1 = make_release(tmp_path, "s", "r1")
    await runtime.activate(r1)
    assert engine.calls[-1] == ("load", {"lora_name": "s@r1", "lora_path": str(r1.adapter_dir)})
    c = call()
    out = await runtime.complete(c)
    assert out["choices"][0]["message"]["content"] == "s@r1: hello"
    assert out["model"] == BASE and c.extras["adapter"] == "s@r1"
    sent = chats(engine)[-1]
    if engine.flavor == "sglang":
        assert sent["lora_path"] == "s@r1" and sent["model"] == BASE
    else:
        assert sent["model"] == "s@r1" and "lora_path" not in sent
    other = await runtime.complete(call(scenario="other"))
    assert other["choices"][0]["message"]["content"] == "base: hello"


@pytest.mark.asyncio
async def test_streaming_pass_through_and_extras(engine, runtime, tmp_path):
    await runtime.activate(make_release(tmp_path, "s", "r1"))
    c = call(stream=True)
    events = [e async for e in runtime.stream(c)]
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text == "s@r1: hello"
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(e["choices"][0].get("logprobs") is None and "token_ids" not in e["choices"][0] for e in events)
    assert c.extras["adapter"] == "s@r1"
    assert c.extras["logprobs"] == pytest.approx([-0.01 * i for i in range(len(text))])
    if engine.flavor == "vllm":  # vLLM streams token ids; SGLang's chat stream does not
        assert c.extras["response_token_ids"] == [ord(ch) for ch in text]
        assert c.extras["prompt_token_ids"] == [ord(ch) for ch in "hello"]
    assert runtime.serving()["s"]["holds"] == 0


@pytest.mark.asyncio
async def test_hot_swap_keeps_in_flight_request_then_unloads(engine, runtime, tmp_path):
    await runtime.activate(make_release(tmp_path, "s", "r1"))
    engine.gate.clear()
    held = asyncio.create_task(runtime.complete(call("hold")))
    assert await asyncio.to_thread(engine.holding.wait, 30)
    await runtime.activate(make_release(tmp_path, "s", "r2"))
    assert set(engine.loaded) == {"s@r1", "s@r2"}  # r1 still serves the held request
    assert runtime.serving()["_draining"] == {"s@r1": 1}
    fresh = await runtime.complete(call())
    assert fresh["choices"][0]["message"]["content"] == "s@r2: hello"
    engine.gate.set()
    assert (await held)["choices"][0]["message"]["content"] == "s@r1: hold"
    await runtime.aclose()  # waits for background unloads
    assert set(engine.loaded) == {"s@r2"}
    assert ("unload", {"lora_name": "s@r1"}) in engine.calls


@pytest.mark.asyncio
async def test_requests_during_swap_all_succeed(engine, runtime, tmp_path):
    await runtime.activate(make_release(tmp_path, "s", "r1"))

    async def one(i):
        c = call(f"q{i}")
        out = await runtime.complete(c)
        return out["choices"][0]["message"]["content"], c.extras["adapter"]

    first = [asyncio.create_task(one(i)) for i in range(10)]
    swap = asyncio.create_task(runtime.activate(make_release(tmp_path, "s", "r2")))
    second = [asyncio.create_task(one(i)) for i in range(10, 20)]
    await swap
    third = await asyncio.gather(*(one(i) for i in range(20, 25)))
    results = await asyncio.gather(*first, *second) + third
    assert all(text.startswith(f"{adapter}: ") for text, adapter in results)
    assert all(adapter == "s@r2" for _, adapter in third)


@pytest.mark.asyncio
async def test_rollback_to_base_release_unloads(engine, runtime, tmp_path):
    await runtime.activate(make_release(tmp_path, "s", "r1"))
    await runtime.activate(make_release(tmp_path, "s", "r2", adapter=False))
    assert engine.loaded == {}
    out = await runtime.complete(call())
    assert out["choices"][0]["message"]["content"] == "base: hello"
    await runtime.activate(make_release(tmp_path, "s", "r3"))
    assert set(engine.loaded) == {"s@r3"}


@pytest.mark.asyncio
async def test_errors_are_relayed_clearly(engine, runtime, tmp_path):
    with pytest.raises(RuntimeCallError) as info:
        await runtime.complete(call(lora_path="other@r1"))
    assert info.value.status == 400 and info.value.body["error"]["param"] == "lora_path"

    bad = ActiveRelease(scenario="s", release_id="bad", path=tmp_path / "bad")
    (bad.path / "adapter").mkdir(parents=True)
    with pytest.raises(RuntimeCallError, match="refused to load adapter 's@bad'"):
        await runtime.activate(bad)
    assert (await runtime.complete(call()))["choices"][0]["message"]["content"] == "base: hello"  # still serving

    await runtime.activate(make_release(tmp_path, "s", "r1"))
    engine.loaded.clear()  # the engine restarted and forgot the adapter
    with pytest.raises(RuntimeCallError) as info:
        await runtime.complete(call())
    assert info.value.status == 400 and "not loaded" in info.value.body["error"]["message"]
    assert runtime.serving()["s"]["holds"] == 0


@pytest.mark.asyncio
async def test_unreachable_engine_is_runtime_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rt = SGLangRuntime(base_url=f"http://127.0.0.1:{port}", model=BASE, connect_timeout_s=2)
    with pytest.raises(RuntimeUnavailable) as info:
        await rt.complete(call())
    assert info.value.status == 502 and "runtime.base_url" in str(info.value)
    await rt.aclose()


def test_plugin_wiring_and_config_schema():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="reef")}
    assert eps.get("sglang") == "reef_sglang.plugin"
    got = {}
    sglang_plugin.register_runtimes(lambda name, cls: got.setdefault(name, cls))
    assert got == {"sglang": SGLangRuntime}
    options = yaml.safe_load((Path(sglang_plugin.reef_config_dir()) / "runtime" / "sglang.yaml").read_text())
    assert options.pop("name") == "sglang"
    params = inspect.signature(SGLangRuntime).parameters
    assert set(options) == set(params)
    assert all(params[k].default == v for k, v in options.items())
    with pytest.raises(ValueError, match="flavor"):
        SGLangRuntime(flavor="tgi")


@pytest.mark.asyncio
async def test_rollback_while_draining_revives_without_reloading(engine, runtime, tmp_path):
    r1 = make_release(tmp_path, "s", "r1")
    await runtime.activate(r1)
    engine.gate.clear()
    held = asyncio.create_task(runtime.complete(call("hold")))
    assert await asyncio.to_thread(engine.holding.wait, 30)
    await runtime.activate(make_release(tmp_path, "s", "r2"))
    await runtime.activate(r1)  # roll back while r1 still serves the held request
    assert set(engine.loaded) == {"s@r1"}  # r2 unused: unloaded at once
    engine.gate.set()
    assert (await held)["choices"][0]["message"]["content"] == "s@r1: hold"
    await runtime.aclose()
    assert set(engine.loaded) == {"s@r1"}  # the drain did not unload the revived version
    loads = [body["lora_name"] for kind, body in engine.calls if kind == "load"]
    assert loads == ["s@r1", "s@r2"]


@pytest.mark.asyncio
async def test_candidate_release_on_the_call_is_loaded_for_it_alone(engine, runtime, tmp_path):
    candidate = make_release(tmp_path, "s", "candidate:c1")
    c = call()
    c.release = candidate
    await runtime.complete(c)
    assert c.extras["adapter"] == "s@candidate:c1"
    assert chats(engine)[-1].get("lora_path" if engine.flavor == "sglang" else "model") == "s@candidate:c1"
    for _ in range(50):  # the unload runs in the background once the request is done
        if not engine.loaded:
            break
        await asyncio.sleep(0.02)
    assert engine.loaded == {}
    plain = call()
    await runtime.complete(plain)
    assert plain.extras["adapter"] is None  # serving never switched to the candidate


@pytest.mark.asyncio
async def test_a_call_that_leaves_while_its_release_loads_leaves_nothing_loaded(engine, runtime, tmp_path):
    """The caller (a client gone, an evaluation cut) left while the engine loaded its release: the
    load went on without the bookkeeping after it, so the adapter stayed on the engine for good."""
    c = call()
    c.release = make_release(tmp_path, "s", "candidate:c1")
    engine.load_gate.clear()
    task = asyncio.create_task(runtime.complete(c))
    assert await asyncio.to_thread(engine.loading.wait, 10)
    task.cancel()
    engine.load_gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):  # the load ends, then the unload runs in the background
        if ("unload", {"lora_name": "s@candidate:c1"}) in engine.calls and not engine.loaded:
            break
        await asyncio.sleep(0.02)
    assert engine.loaded == {} and runtime.adapters.snapshot()["_draining"] == {}
