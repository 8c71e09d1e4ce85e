"""Bounded memory of the local runtime: the KV buffer is reused, bounded and exact.

No RSS assertions (flaky): the checks are structural. The KV buffer's window must equal what
a per-batch ``torch.cat`` cache would hold after any sequence of joins, steps and drops; after
traffic the engine holds no per-request tensors; the buffer's capacity never passes its limit.
"""

from __future__ import annotations

import asyncio
import gc
import random
import types

import pytest
import torch

from reef_core import InferenceCall, RuntimeCallError
from reef_torch import LocalRuntime
from reef_torch.kv_cache import CacheLimitError, KVBuffer

HEADS, DIM, LAYERS = 2, 3, 2


def _lpad(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.cat([t.new_zeros((t.shape[0], width - t.shape[1], t.shape[2])), t], 1)


class Reference:
    """Each running row's keys as its own tensor ``[heads, length, dim]`` (per layer, K and V)."""

    def __init__(self):
        self.rows: list[list[tuple[torch.Tensor, torch.Tensor]]] = []

    def window(self, layer: int, which: int) -> torch.Tensor:
        width = max(r[layer][which].shape[1] for r in self.rows)
        return torch.stack([_lpad(r[layer][which], width) for r in self.rows])


def _rand(*shape):
    return torch.randn(*shape)


def _admit(buf: KVBuffer, ref: Reference, lengths: list[int]) -> None:
    width = max(lengths)
    new_rows = [[(_rand(HEADS, n, DIM), _rand(HEADS, n, DIM)) for _ in range(LAYERS)] for n in lengths]
    layers = []
    for layer in range(LAYERS):
        keys = torch.stack([_lpad(r[layer][0], width) for r in new_rows])
        values = torch.stack([_lpad(r[layer][1], width) for r in new_rows])
        layers.append((keys, values))
    buf.admit(layers)
    ref.rows += new_rows


def _step(buf: KVBuffer, ref: Reference) -> None:
    buf.reserve(1)
    n = len(ref.rows)
    for layer in range(LAYERS):
        k, v = _rand(n, HEADS, 1, DIM), _rand(n, HEADS, 1, DIM)
        keys, values = buf.write(layer, k, v)
        for i, row in enumerate(ref.rows):
            row[layer] = (torch.cat([row[layer][0], k[i]], 1), torch.cat([row[layer][1], v[i]], 1))
        # what the model sees during the forward: the window including this step's column
        assert torch.equal(keys, ref.window(layer, 0)) and torch.equal(values, ref.window(layer, 1))
    buf.advance(1)


def _drop(buf: KVBuffer, ref: Reference, keep: list[int]) -> None:
    old_width = max(r[0][0].shape[1] for r in ref.rows)
    ref.rows = [ref.rows[i] for i in keep]
    new_width = max((r[0][0].shape[1] for r in ref.rows), default=0)
    buf.keep(keep, old_width - new_width)


def _check(buf: KVBuffer, ref: Reference) -> None:
    assert buf.rows == len(ref.rows)
    if not ref.rows:
        return
    for layer in range(LAYERS):
        window = buf.keys[layer][: buf.rows, :, buf.start : buf.end]
        assert torch.equal(window, ref.window(layer, 0))
        window = buf.values[layer][: buf.rows, :, buf.start : buf.end]
        assert torch.equal(window, ref.window(layer, 1))


@pytest.mark.parametrize("seed", range(6))
def test_buffer_window_equals_a_concatenated_cache_under_churn(seed):
    """Random joins (wider and narrower), steps, drops (middle rows, all rows): the buffer's
    window is always exactly the left-padded cache, and capacity stays within max_len."""
    rng = random.Random(seed)
    buf = KVBuffer(max_rows=5, max_len=64, chunk=4, keep_len=16)
    ref = Reference()
    for _ in range(120):
        op = rng.random()
        free = buf.max_rows - len(ref.rows)
        longest = max((r[0][0].shape[1] for r in ref.rows), default=0)
        if free and op < 0.25:
            _admit(buf, ref, [rng.randint(1, 20) for _ in range(rng.randint(1, free))])
        elif ref.rows and op < 0.8 and longest + 1 < buf.max_len:
            _step(buf, ref)
        elif ref.rows:
            keep = sorted(rng.sample(range(len(ref.rows)), rng.randint(0, len(ref.rows) - 1)))
            _drop(buf, ref, keep)
        _check(buf, ref)
        assert buf.capacity <= buf.max_len


def test_buffer_is_reused_across_batches_and_released_when_oversized():
    buf = KVBuffer(max_rows=2, max_len=100, chunk=8, keep_len=16)
    ref = Reference()
    _admit(buf, ref, [3, 5])
    first = buf.keys[0].data_ptr()
    for _ in range(3):
        _step(buf, ref)
    _drop(buf, ref, [])
    _admit(buf, ref, [4])
    _step(buf, ref)
    assert buf.keys[0].data_ptr() == first and buf.allocations == 1  # same storage, no new blocks
    for _ in range(20):  # grows past keep_len ...
        _step(buf, ref)
    assert 16 < buf.capacity <= 100
    _drop(buf, ref, [])
    assert buf.capacity == 0 and buf.nbytes == 0  # ... so it is let go when the batch empties


def test_buffer_refuses_to_grow_past_its_limit():
    buf = KVBuffer(max_rows=1, max_len=10, chunk=4)
    ref = Reference()
    _admit(buf, ref, [9])
    _step(buf, ref)
    assert buf.capacity == 10
    with pytest.raises(CacheLimitError, match="at most 10"):
        buf.reserve(1)


# ---------------------------------------------------------------------------- through the runtime

PROMPTS = ["hello", "what is two plus two?", "tell me a story about the sea", "hi", "ok", "why is the sky blue", "abc"]


def call(text: str, **body) -> InferenceCall:
    return InferenceCall(scenario="s", record_id="rec", body={"messages": [{"role": "user", "content": text}], **body})


@pytest.fixture
async def runtime(tiny_model_dir):
    rt = LocalRuntime(model=str(tiny_model_dir), device="cpu", max_batch_size=3, batch_window_ms=5)
    await rt.start()
    # small chunks so a few short requests exercise growth, compaction and release
    rt.engine.kv = KVBuffer(rt.max_batch_size, rt.engine.kv.max_len, chunk=4, keep_len=32, layers=rt.engine.kv.layers)
    yield rt
    await rt.aclose()


async def _greedy(rt, text: str, tokens: int) -> str:
    out = await rt.complete(call(text, temperature=0, max_tokens=tokens))
    return out["choices"][0]["message"]["content"]


#: what the walk from the engine does not enter: the model, classes, and code with its module
#: globals and event loops (through those everything in the process is reachable)
_NOT_PER_REQUEST = (torch.nn.Module, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                    asyncio.AbstractEventLoop)


def _engine_tensors(engine) -> int:
    """Tensors the engine keeps alive, reached from it through anything but a torch module
    (the model's parameters and caches are not per request), not counting the KV buffer's own.

    Counting every tensor in the process instead would also count what other tests or
    libraries leave behind in a shared test process."""
    gc.collect()
    own = {id(t) for t in (*engine.kv.keys, *engine.kv.values)}
    seen, todo, found = {id(engine)}, [engine], 0
    while todo:
        for ref in gc.get_referents(todo.pop()):
            if id(ref) in seen or isinstance(ref, _NOT_PER_REQUEST):
                continue
            seen.add(id(ref))
            if isinstance(ref, torch.Tensor):
                found += id(ref) not in own
                continue
            todo.append(ref)
    return found


@pytest.mark.asyncio
async def test_churning_batches_match_solo_and_leave_nothing_behind(runtime):
    """More requests than batch rows, of varied prompt and completion lengths: rows join and
    leave mid-flight, yet each answer equals its solo greedy answer; afterwards the engine holds
    no rows, no per-request tensors, and a buffer within its bound."""
    jobs = [(PROMPTS[i % len(PROMPTS)] + " again" * (i % 3), 4 + (i * 5) % 13) for i in range(14)]
    solo = [await _greedy(runtime, text, tokens) for text, tokens in jobs]
    engine = runtime.engine
    await _idle(engine)
    baseline = _engine_tensors(engine)
    for _ in range(2):
        together = await asyncio.gather(*(_greedy(runtime, text, tokens) for text, tokens in jobs))
        assert together == solo
    assert max(n for kind, n in engine.forward_log if kind == "decode") == 3
    await _idle(engine)
    assert engine.kv.rows == 0 and engine.running == 0 and engine._mask is None
    assert engine.kv.capacity <= engine.kv.keep_len
    assert _engine_tensors(engine) == baseline


async def _idle(engine) -> None:
    """Wait until the worker has retired the last batch (it signals "done" just before)."""
    for _ in range(1000):
        if engine.kv.rows == 0 and engine.running == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the engine kept rows after every request finished")


@pytest.mark.asyncio
async def test_request_beyond_the_engine_limit_is_refused_clearly(runtime):
    """An engine bounded below the model's context refuses, by name, a request that could outgrow
    it, and serves the others; the buffer never passes the bound."""
    runtime.engine.kv = KVBuffer(runtime.max_batch_size, 40, chunk=4, layers=runtime.engine.kv.layers)
    short = await _greedy(runtime, "hi", 4)
    assert isinstance(short, str)
    with pytest.raises(RuntimeCallError, match="limit"):
        await _greedy(runtime, "tell me a story about the sea", 30)
    await _idle(runtime.engine)
    assert runtime.engine.kv.capacity <= 40
