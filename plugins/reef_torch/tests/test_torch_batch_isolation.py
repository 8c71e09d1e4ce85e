"""What one client sends cannot break the requests it shares a batch with."""

from __future__ import annotations

import asyncio

import pytest
from reef_torch_testing import Gate

from reef_core import InferenceCall, RuntimeCallError
from reef_torch import LocalRuntime


def call(text: str, **body) -> InferenceCall:
    return InferenceCall(scenario="s", record_id="rec", body={"messages": [{"role": "user", "content": text}], **body})


@pytest.fixture
async def runtime(tiny_model_dir):
    rt = LocalRuntime(model=str(tiny_model_dir), device="cpu", max_new_tokens_default=16, max_batch_size=8, batch_window_ms=5)
    await rt.start()
    yield rt
    await rt.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**30])
async def test_any_integer_seed_samples_and_spares_the_running_batch(runtime, seed):
    engine = runtime.engine
    gate = Gate(engine, lambda row: len(row.tokens) == 2)
    running = asyncio.create_task(runtime.complete(call("hello", temperature=0, max_tokens=12)))
    await gate.wait()  # a sequence is mid-generation when the odd seed arrives
    odd = asyncio.create_task(runtime.complete(call("hi", temperature=1.0, seed=seed, max_tokens=4)))
    await asyncio.sleep(0.05)
    gate.open()
    first = await asyncio.wait_for(running, 30)
    assert first["usage"]["completion_tokens"] >= 1
    try:
        out = await asyncio.wait_for(odd, 30)
    except RuntimeCallError as exc:  # a 400 would do; a 500 or no answer would not
        assert exc.status == 400
    else:
        assert out["usage"]["completion_tokens"] >= 1


@pytest.mark.asyncio
@pytest.mark.parametrize("temperature", [1e-40, 5e-324])
async def test_a_vanishing_temperature_samples_greedily_and_spares_the_running_batch(runtime, temperature):
    greedy = await runtime.complete(call("hi", temperature=0, max_tokens=4))
    engine = runtime.engine
    gate = Gate(engine, lambda row: len(row.tokens) == 2)
    running = asyncio.create_task(runtime.complete(call("hello", temperature=0, max_tokens=12)))
    await gate.wait()
    odd_call = call("hi", temperature=temperature, max_tokens=4)
    odd = asyncio.create_task(runtime.complete(odd_call))
    await asyncio.sleep(0.05)
    gate.open()
    first = await asyncio.wait_for(running, 30)
    assert first["usage"]["completion_tokens"] >= 1
    out = await asyncio.wait_for(odd, 30)
    assert out["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]
    assert all(lp == lp and lp <= 0 for lp in odd_call.extras["logprobs"])  # no NaN
