"""Long prompts on the local runtime: memory that follows the batch, chunked prefill, the context.

- the KV buffer allocates rows as the batch grows, not ``max_batch_size`` rows up front;
- a long prompt is prefilled in forwards of at most ``prefill_chunk_tokens`` tokens, straight
  into the buffer, and answers exactly as a one-forward prefill does;
- every forward computes logits for the last position only;
- a prompt that leaves no room in the context is refused with a 400 naming the limit, in each
  dialect's error shape, streamed or not; below the limit it is served (property-based).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reef_core import InferenceCall, RuntimeCallError
from reef_torch import LocalRuntime
from reef_torch.kv_cache import KVBuffer
from reef_torch.openai_format import parse_chat_request


def call(text: str, **body) -> InferenceCall:
    return InferenceCall(scenario="s", record_id="rec", body={"messages": [{"role": "user", "content": text}], **body})


def prompt_tokens(rt, text: str) -> int:
    """How many tokens the runtime's prompt for one user message ``text`` is."""
    return len(rt._prompt_ids(parse_chat_request({"messages": [{"role": "user", "content": text}]})))


# ---------------------------------------------------------------------------- the KV buffer's rows


def _rows(n: int, width: int, layers: int = 2, heads: int = 2, dim: int = 3):
    return [(torch.randn(n, heads, width, dim), torch.randn(n, heads, width, dim)) for _ in range(layers)]


def test_rows_are_allocated_as_the_batch_grows_not_up_front():
    """One long conversation holds one row of keys and values, not ``max_rows`` of them; more
    rows come (at least doubling) as rows join, never past ``max_rows``."""
    buf = KVBuffer(max_rows=8, max_len=400, chunk=8, layers=2)
    buf.admit(_rows(1, 300))
    one_row = 2 * 2 * (2 * buf.capacity * 3) * 4  # layers x (keys, values) x heads x columns x dim x 4 bytes
    assert buf.row_capacity == 1 and buf.nbytes == one_row
    buf.admit(_rows(2, 10))
    assert buf.row_capacity == 3
    buf.admit(_rows(1, 10))
    assert buf.row_capacity == 6  # doubled: the next joins reuse it
    buf.admit(_rows(2, 10))
    assert buf.row_capacity == 6 and buf.rows == 6
    buf.admit(_rows(2, 10))
    assert buf.row_capacity == 8 == buf.max_rows


# ---------------------------------------------------------------------------- chunked prefill


@pytest.fixture
async def runtime(tiny_model_dir):
    rt = LocalRuntime(model=str(tiny_model_dir), device="cpu", max_batch_size=4, batch_window_ms=30)
    await rt.start()
    yield rt
    await rt.aclose()


class ForwardSpy:
    """Records, for every forward of the served model, the tokens it was given, its
    ``logits_to_keep``, and how many positions reached the output head."""

    def __init__(self, model):
        self.calls: list[dict] = []
        self._handles = [
            model.register_forward_pre_hook(self._pre, with_kwargs=True),
            model.get_output_embeddings().register_forward_hook(self._head),
        ]

    def _pre(self, _module, args, kwargs):
        self.calls.append({"tokens": kwargs["input_ids"].shape[1], "logits_to_keep": kwargs.get("logits_to_keep")})

    def _head(self, _module, inputs, _output):
        self.calls[-1]["head_positions"] = inputs[0].shape[1]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


async def _answer(rt, text: str, tokens: int = 6) -> tuple[list[int], list[float]]:
    c = call(text, temperature=0, max_tokens=tokens)
    await rt.complete(c)
    return c.extras["response_token_ids"], c.extras["logprobs"]


LONG = "the quick brown fox jumps over the lazy dog; " * 7  # about 320 tokens with the template


@pytest.mark.asyncio
async def test_long_prompt_is_prefilled_in_chunks_with_the_same_answer(runtime):
    engine = runtime.engine
    engine.prefill_chunk_tokens = 10_000
    whole = await _answer(runtime, LONG)
    engine.prefill_chunk_tokens = 48
    spy = ForwardSpy(engine.model)
    try:
        engine.forward_log.clear()
        chunked = await _answer(runtime, LONG)
    finally:
        spy.close()
    prefills = [n for kind, n in engine.forward_log if kind == "prefill"]
    assert len(prefills) == -(-prompt_tokens(runtime, LONG) // 48) > 1  # one forward per chunk
    assert max(c["tokens"] for c in spy.calls) <= 48
    assert chunked[0] == whole[0]
    assert chunked[1] == pytest.approx(whole[1], abs=1e-4)
    assert engine.kv.row_capacity <= 1  # one conversation, one row (or released once idle)


@pytest.mark.asyncio
async def test_concurrent_long_and_short_prompts_match_their_solo_answers(runtime):
    """A long prompt (chunked, alone) and short ones (sharing a forward) admitted together, and a
    newcomer joining them mid-flight: each answer is its solo answer."""
    texts = [LONG, "hi", "what is two plus two?", LONG[:150]]
    runtime.engine.prefill_chunk_tokens = 10_000
    solo = [await _answer(runtime, t, 8) for t in texts]
    runtime.engine.prefill_chunk_tokens = 96
    together = await asyncio.gather(*(_answer(runtime, t, 8) for t in texts))
    assert [t[0] for t in together] == [s[0] for s in solo]
    for (_, got), (_, want) in zip(together, solo):
        assert got == pytest.approx(want, abs=1e-4)


@pytest.mark.asyncio
async def test_a_prefill_whose_client_left_stops_between_two_chunks(runtime):
    """A long prompt's prefill runs for seconds in chunks: once its only request is cancelled
    (the client went away), the engine stops at the next chunk instead of prefilling for nobody,
    and serves the next request as before."""
    from reef_torch.engine import GenerationRequest

    engine = runtime.engine
    engine.prefill_chunk_tokens = 8
    ids = runtime._prompt_ids(parse_chat_request({"messages": [{"role": "user", "content": LONG}]}))
    left, said = threading.Event(), []
    req = GenerationRequest(prompt_ids=ids, max_new_tokens=4, sink=lambda kind, payload: said.append(kind),
                            on_leave=left.set)
    handle = engine.model.register_forward_pre_hook(lambda *_: req.cancel())  # gone during the first chunk
    try:
        engine.forward_log.clear()
        engine.submit(req)
        assert await asyncio.to_thread(left.wait, 30)
    finally:
        handle.remove()
    prefills = [n for kind, n in engine.forward_log if kind == "prefill"]
    assert len(ids) > 8 * 10 and len(prefills) == 1 and said == []  # one chunk of more than ten, no answer
    assert len((await _answer(runtime, "hi"))[0]) > 0


@pytest.mark.asyncio
async def test_prompts_render_off_the_event_loop_and_a_far_too_long_one_is_refused_unrendered(runtime, monkeypatch):
    rendered = []
    real = runtime._prompt_ids

    def spy(params):
        rendered.append(threading.current_thread().name)
        return real(params)

    monkeypatch.setattr(runtime, "_prompt_ids", spy)
    await _answer(runtime, "hi")
    assert len(rendered) == 1 and rendered[0].startswith("reef-local-render")
    # more characters than the context's tokens could hold at the vocabulary's longest token
    with pytest.raises(RuntimeCallError) as info:
        await runtime.complete(call("x" * (runtime.context_tokens * runtime._longest_token)))
    assert info.value.status == 400 and info.value.body["error"]["code"] == "context_length_exceeded"
    assert len(rendered) == 1  # refused without rendering or tokenizing it


@pytest.fixture(scope="module")
def looped_runtime(tiny_model_dir):
    """A runtime on its own event loop, for property-based tests (function-scoped fixtures and
    hypothesis do not mix)."""
    loop = asyncio.new_event_loop()
    rt = LocalRuntime(model=str(tiny_model_dir), device="cpu", max_batch_size=4, batch_window_ms=30)
    loop.run_until_complete(rt.start())
    yield rt, loop
    loop.run_until_complete(rt.aclose())
    loop.close()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(min_value=1, max_value=160), min_size=1, max_size=4),
       chunk=st.integers(min_value=3, max_value=200))
def test_any_chunk_size_and_mix_of_prompts_gives_the_one_forward_answers(looped_runtime, lengths, chunk):
    rt, loop = looped_runtime
    texts = [LONG[:n] for n in lengths]
    rt.engine.prefill_chunk_tokens = 10_000
    solo = [loop.run_until_complete(_answer(rt, t, 4)) for t in texts]
    rt.engine.prefill_chunk_tokens = chunk

    async def together():
        return await asyncio.gather(*(_answer(rt, t, 4) for t in texts))

    got = loop.run_until_complete(together())
    assert [g[0] for g in got] == [s[0] for s in solo]
    for (_, lp), (_, want) in zip(got, solo):
        assert lp == pytest.approx(want, abs=1e-4)


@pytest.mark.asyncio
async def test_every_forward_computes_logits_for_the_last_position_only(runtime):
    """Prefill (batched, chunked) and decode ask the model for one position's logits: over a whole
    8k-token prompt they would be 8192 x 49152 floats (1.6 GB for SmolLM2)."""
    runtime.engine.prefill_chunk_tokens = 64
    spy = ForwardSpy(runtime.engine.model)
    try:
        await asyncio.gather(*(_answer(runtime, t, 4) for t in (LONG, "hi", "ok")))
    finally:
        spy.close()
    assert any(c["tokens"] > 1 for c in spy.calls)  # prefills were among them
    assert all(c["logits_to_keep"] == 1 and c["head_positions"] == 1 for c in spy.calls), spy.calls


# ---------------------------------------------------------------------------- the context


@pytest.fixture(scope="module")
def small_context(tiny_model_dir):
    """A runtime whose conversations hold at most 40 tokens, on its own event loop."""
    loop = asyncio.new_event_loop()
    rt = LocalRuntime(model=str(tiny_model_dir), device="cpu", max_context_tokens=40, batch_window_ms=0)
    loop.run_until_complete(rt.start())
    yield rt, loop
    loop.run_until_complete(rt.aclose())
    loop.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(length=st.integers(min_value=0, max_value=40), max_tokens=st.integers(min_value=1, max_value=50))
def test_a_prompt_is_served_iff_the_context_leaves_room_for_an_answer(small_context, length, max_tokens):
    rt, loop = small_context
    text = "y" * length
    prompt = prompt_tokens(rt, text)
    c = call(text, temperature=0, max_tokens=max_tokens)
    if prompt >= 40:
        with pytest.raises(RuntimeCallError) as info:
            loop.run_until_complete(rt.complete(c))
        err = info.value
        assert err.status == 400 and err.body["error"]["code"] == "context_length_exceeded"
        assert str(err).startswith(f"prompt is too long: {prompt} tokens > 39 maximum")
        assert "runtime.max_context_tokens is 40 tokens" in str(err)
    else:
        out = loop.run_until_complete(rt.complete(c))
        assert 1 <= out["usage"]["completion_tokens"] <= min(max_tokens, 40 - prompt)


# ---------------------------------------------------------------------------- through HTTP

serve_testing = pytest.importorskip("reef_core.testing")


@pytest.fixture(scope="module")
def reef(tiny_model_dir, tmp_path_factory):
    overrides = ["runtime=local", f"runtime.model={tiny_model_dir}", "runtime.max_new_tokens_default=4",
                 "runtime.device=cpu"]
    with serve_testing.ReefServer(tmp_path_factory.mktemp("reef-long"), overrides) as server:
        yield server


TOO_LONG = "z" * 600  # the tiny model's context is 512 tokens; its tokenizer is one token a character


def _requests(model: str, text: str, stream: bool) -> dict[str, dict]:
    return {
        "/v1/chat/completions": {"model": model, "messages": [{"role": "user", "content": text}], "stream": stream},
        "/v1/messages": {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": text}],
                         "stream": stream},
        "/v1/responses": {"model": model, "input": text, "stream": stream},
    }


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_prompt_past_the_context_is_a_clear_400_in_each_dialect(reef, path, stream):
    model = reef.reef.runtime.model_id
    with reef.client() as client:
        r = client.post(path, json=_requests(model, TOO_LONG, stream)[path])
        assert r.status_code == 400, r.text
        body = r.json()
        error = body["error"]
        assert error["message"].startswith("prompt is too long: ") and "> 511 maximum" in error["message"]
        assert f"{model}'s context is 512 tokens" in error["message"]
        if path == "/v1/messages":
            assert body["type"] == "error" and error["type"] == "invalid_request_error"
        else:
            assert error["type"] == "invalid_request_error"
        if path == "/v1/chat/completions":
            assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
        # the same route serves a prompt that fits
        ok = client.post(path, json=_requests(model, "hello", False)[path])
        assert ok.status_code == 200, ok.text
