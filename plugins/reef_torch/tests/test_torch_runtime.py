"""The local runtime on a tiny random Llama: wire shape, sampling options, batching."""

from __future__ import annotations

import asyncio

import pytest
from reef_torch_testing import Gate, wait_until

from reef_core import InferenceCall, RuntimeCallError
from reef_torch import LocalRuntime

PROMPTS = ["hello", "what is two plus two?", "tell me a story", "hi", "ok", "why is the sky blue", "abc", "zzz top"]


def call(text: str, scenario: str = "s", **body) -> InferenceCall:
    return InferenceCall(scenario=scenario, record_id="rec", body={"messages": [{"role": "user", "content": text}], **body})


@pytest.fixture
async def runtime(tiny_model_dir):
    rt = LocalRuntime(model=str(tiny_model_dir), device="cpu", max_new_tokens_default=16, max_batch_size=8, batch_window_ms=20)
    await rt.start()
    yield rt
    await rt.aclose()


async def greedy(rt, text, **body):
    c = call(text, temperature=0, **body)
    out = await rt.complete(c)
    return out, c.extras


async def long_prompts(rt, n, max_tokens=24):
    """Prompts whose greedy answer runs to max_tokens on this random model (no early EOS)."""
    found = []
    for i in range(60):
        text = f"prompt number {i}"
        out, _ = await greedy(rt, text, max_tokens=max_tokens)
        if out["choices"][0]["finish_reason"] == "length":
            found.append(text)
        if len(found) == n:
            return found
    raise AssertionError("the tiny model stopped early on every prompt; pick other prompts")


@pytest.mark.asyncio
async def test_completion_shape_and_extras(runtime):
    out, extras = await greedy(runtime, "hello", max_tokens=10)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    assert out["model"] == runtime.model_id and isinstance(out["created"], int)
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = out["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens"] == len(extras["prompt_token_ids"])
    assert usage["completion_tokens"] == len(extras["response_token_ids"]) == len(extras["logprobs"])
    assert all(lp <= 0 for lp in extras["logprobs"])
    assert extras["adapter"] is None and extras["logprobs_temperature"] == 1.0
    decoded = runtime.tokenizer.decode(extras["response_token_ids"], skip_special_tokens=True)
    assert decoded == choice["message"]["content"]
    assert runtime.models() == [runtime.model_id]


@pytest.mark.asyncio
async def test_max_tokens_gives_length(runtime):
    (text,) = await long_prompts(runtime, 1)
    out, extras = await greedy(runtime, text, max_completion_tokens=3)
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 3 == len(extras["response_token_ids"])


@pytest.mark.asyncio
async def test_stop_string_cuts_before_it(runtime):
    (text,) = await long_prompts(runtime, 1)
    full, _ = await greedy(runtime, text, max_tokens=24)
    content = full["choices"][0]["message"]["content"]
    stop = content[3:5]
    expected = content[: content.find(stop)]
    out, extras = await greedy(runtime, text, max_tokens=24, stop=[stop, "\u2603never"])
    assert out["choices"][0]["message"]["content"] == expected
    assert out["choices"][0]["finish_reason"] == "stop"
    assert len(extras["response_token_ids"]) < 24
    chunks = [c async for c in runtime.stream(call(text, temperature=0, max_tokens=24, stop=stop, stream=True))]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.asyncio
async def test_streaming_matches_non_streamed(runtime):
    out, extras = await greedy(runtime, "tell me a story", max_tokens=12)
    c = call("tell me a story", temperature=0, max_tokens=12, stream=True)
    chunks = [ch async for ch in runtime.stream(c)]
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert len({ch["id"] for ch in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == out["choices"][0]["finish_reason"]
    assert last["usage"] == out["usage"]
    assert all(ch["choices"][0]["finish_reason"] is None for ch in chunks[:-1])
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks)
    assert text == out["choices"][0]["message"]["content"]
    assert c.extras["response_token_ids"] == extras["response_token_ids"]


@pytest.mark.asyncio
async def test_logprobs_in_body_when_asked(runtime):
    out, extras = await greedy(runtime, "hello", max_tokens=6, logprobs=True)
    content = out["choices"][0]["logprobs"]["content"]
    assert [e["logprob"] for e in content] == extras["logprobs"]


@pytest.mark.asyncio
async def test_logprobs_when_streamed_arrive_with_the_last_chunk(runtime):
    c = call("hello", temperature=0, max_tokens=6, logprobs=True)
    chunks = [ch async for ch in runtime.stream(c)]
    streamed = [e for ch in chunks for e in ((ch["choices"][0]["logprobs"] or {}).get("content") or [])]
    assert [e["logprob"] for e in streamed] == c.extras["logprobs"] and len(streamed) == 6
    assert chunks[-1]["choices"][0]["logprobs"]["content"] == streamed
    plain = [ch async for ch in runtime.stream(call("hello", temperature=0, max_tokens=6))]
    assert all(ch["choices"][0]["logprobs"] is None for ch in plain)


@pytest.mark.asyncio
async def test_seed_makes_sampling_reproducible_even_inside_a_batch(runtime):
    async def sample(seed, text="hello"):
        c = call(text, temperature=1.0, top_p=0.95, seed=seed, max_tokens=16)
        await runtime.complete(c)
        return c.extras["response_token_ids"]

    first = await sample(42)
    assert await sample(42) == first
    assert await sample(43) != first
    together = await asyncio.gather(sample(42), sample(7, "other"), sample(8, "more"), sample(42))
    assert together[0] == first and together[3] == first


@pytest.mark.asyncio
async def test_top_k_one_samples_the_greedy_answer(runtime):
    """top_k reaches the sampler: with only the most likely token left, sampling is greedy."""
    _, greedy_extras = await greedy(runtime, "hello", max_tokens=12)
    drawn = []
    for seed in (1, 2, 3):
        c = call("hello", temperature=1.5, top_k=1, seed=seed, max_tokens=12)
        await runtime.complete(c)
        drawn.append(c.extras["response_token_ids"])
    assert drawn == [greedy_extras["response_token_ids"]] * 3
    loose = call("hello", temperature=1.5, seed=1, max_tokens=12)
    await runtime.complete(loose)
    assert loose.extras["response_token_ids"] != greedy_extras["response_token_ids"]  # the test can fail


@pytest.mark.asyncio
async def test_n_greater_than_one_is_a_clear_400(runtime):
    with pytest.raises(RuntimeCallError) as info:
        await runtime.complete(call("hi", n=2))
    assert info.value.status == 400 and "'n' must be 1" in info.value.body["error"]["message"]


@pytest.mark.asyncio
async def test_prompt_longer_than_context_is_400(runtime):
    with pytest.raises(RuntimeCallError) as info:
        await runtime.complete(call("x" * 600))
    assert info.value.status == 400 and info.value.body["error"]["param"] == "messages"


@pytest.mark.asyncio
async def test_concurrent_requests_share_batched_forwards(runtime):
    runtime.engine.forward_log.clear()
    calls = [call(p, temperature=0, max_tokens=8) for p in PROMPTS[:6]]
    outs = await asyncio.gather(*(runtime.complete(c) for c in calls))
    tokens = sum(o["usage"]["completion_tokens"] for o in outs)
    log = list(runtime.engine.forward_log)
    decodes = [n for kind, n in log if kind == "decode"]
    assert max(n for _, n in log) >= 2
    # one forward per step for the whole batch: far fewer forwards than tokens generated
    assert len(log) < tokens
    assert sum(n for kind, n in log if kind == "prefill") == 6
    assert sum(decodes) + 6 == tokens  # every token but each first comes from a decode row


@pytest.mark.asyncio
async def test_batched_and_joined_mid_flight_equal_solo_results(runtime):
    texts = await long_prompts(runtime, 3)
    solo = []
    for t in texts:
        _out, extras = await greedy(runtime, t, max_tokens=24)
        solo.append((extras["prompt_token_ids"], extras["response_token_ids"]))

    engine = runtime.engine
    first_prompt = solo[0][0]
    gate = Gate(engine, lambda row: row.req.prompt_ids == first_prompt and len(row.tokens) == 5)
    first = asyncio.create_task(greedy(runtime, texts[0], max_tokens=24))
    await gate.wait()  # the first sequence is mid-generation, the worker paused
    later = [asyncio.create_task(greedy(runtime, t, max_tokens=24)) for t in texts[1:]]
    await wait_until(lambda: len(engine._pending) == 2, "both newcomers are queued")
    engine.forward_log.clear()
    gate.open()
    results = [await first] + [await t for t in later]
    # newcomers were prefilled together, merged into the running batch (left-padded KV caches
    # of different lengths), and decoded with it — yet every answer equals its solo run
    assert list(engine.forward_log)[:2] == [("prefill", 2), ("decode", 3)]
    assert [r[1]["response_token_ids"] for r in results] == [s[1] for s in solo]


@pytest.mark.asyncio
async def test_abandoned_stream_leaves_the_batch(runtime):
    (text,) = await long_prompts(runtime, 1, max_tokens=64)
    engine = runtime.engine
    gate = Gate(engine, lambda row: row.req.stream and len(row.tokens) == 3)
    gen = runtime.stream(call(text, temperature=0, max_tokens=64, stream=True))
    await gen.__anext__()  # the role chunk: the request is submitted
    await gate.wait()
    await gen.aclose()  # the client goes away with 61 tokens still to generate
    engine.forward_log.clear()
    gate.open()
    await wait_until(lambda: engine.running == 0, "the abandoned sequence left the batch")
    assert list(engine.forward_log) == []  # not one more decode step for it
    assert runtime.serving()["s"]["holds"] == 0
    out, _ = await greedy(runtime, "still alive?", max_tokens=4)
    assert out["usage"]["completion_tokens"] >= 1


@pytest.mark.asyncio
async def test_lazy_start_and_missing_model_error(tiny_model_dir, tmp_path):
    rt = LocalRuntime(model=str(tiny_model_dir))
    out = await rt.complete(call("hi", temperature=0, max_tokens=2))  # starts on first use
    assert out["usage"]["completion_tokens"] <= 2
    await rt.aclose()
    from reef_torch.model_loading import ModelLoadError

    with pytest.raises(ModelLoadError, match="config.json"):
        await LocalRuntime(model=str(tmp_path)).start()


# ---------------------------------------------------------------------------- one client cannot break the batch


async def _beside_a_running_request(runtime, odd: InferenceCall) -> asyncio.Task:
    """Send ``odd`` while another request is mid-generation; check that one ends well and return
    ``odd``'s task."""
    gate = Gate(runtime.engine, lambda row: len(row.tokens) == 2)
    running = asyncio.create_task(runtime.complete(call("hello", temperature=0, max_tokens=12)))
    await gate.wait()  # a sequence is mid-generation when the odd request arrives
    task = asyncio.create_task(runtime.complete(odd))
    await asyncio.sleep(0.05)
    gate.open()
    assert (await asyncio.wait_for(running, 30))["usage"]["completion_tokens"] >= 1
    return task


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**30])
async def test_any_integer_seed_samples_and_spares_the_running_batch(runtime, seed):
    odd = await _beside_a_running_request(runtime, call("hi", temperature=1.0, seed=seed, max_tokens=4))
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
    odd_call = call("hi", temperature=temperature, max_tokens=4)
    out = await asyncio.wait_for(await _beside_a_running_request(runtime, odd_call), 30)
    assert out["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]
    assert all(lp == lp and lp <= 0 for lp in odd_call.extras["logprobs"])  # no NaN
