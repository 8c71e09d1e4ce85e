"""Per-scenario LoRA adapters: activate, hot swap under load, drain, rollback, side by side."""

from __future__ import annotations

import asyncio

import pytest
from reef_torch_testing import Blocker, Gate, release, wait_until

from reef_core import ActiveRelease, InferenceCall, RuntimeCallError
from reef_torch import LocalRuntime
from reef_train.testing import train_word_adapter

PROMPTS = ["hello", "hi", "what?", "say something", "tell me"]


@pytest.fixture(scope="module")
def word_adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {word: train_word_adapter(tiny_model_dir, root / word, word, PROMPTS, steps=80) for word in ("banana", "cherry")}


@pytest.fixture
async def runtime(tiny_model_dir):
    rt = LocalRuntime(model=str(tiny_model_dir), device="cpu", max_new_tokens_default=12, batch_window_ms=5)
    await rt.start()
    yield rt
    await rt.aclose()


async def ask(rt, scenario="s", text="hello", **body):
    c = InferenceCall(
        scenario=scenario, record_id="r", body={"messages": [{"role": "user", "content": text}], "temperature": 0, **body}
    )
    out = await rt.complete(c)
    return out["choices"][0]["message"]["content"], c.extras["adapter"]


def loaded(rt) -> set[str]:
    return set(getattr(rt.engine.model, "peft_config", {}))


@pytest.mark.asyncio
async def test_activate_changes_outputs_rollback_restores(runtime, word_adapters, tmp_path):
    base_answer, adapter = await ask(runtime)
    assert adapter is None and "banana" not in base_answer

    await runtime.activate(release("s", "r1", tmp_path, word_adapters["banana"]))
    for text in PROMPTS[:3]:
        assert await ask(runtime, text=text) == ("banana", "s@r1")
    assert await ask(runtime, scenario="other") == (base_answer, None)  # other scenarios untouched

    await runtime.activate(release("s", "r2", tmp_path, None))  # a release without adapter/: the base
    assert await ask(runtime) == (base_answer, None)
    assert loaded(runtime) == set()  # r1 drained and deleted

    await runtime.activate(release("s", "r3", tmp_path, word_adapters["banana"]))  # rollback as a new release
    assert await ask(runtime) == ("banana", "s@r3")
    await runtime.activate(release("s", "r1", tmp_path, word_adapters["banana"]))  # or the old release itself
    assert await ask(runtime) == ("banana", "s@r1")
    assert loaded(runtime) == {"s@r1"}


@pytest.mark.asyncio
async def test_swap_under_continuous_load_never_fails_and_names_each_version(runtime, word_adapters, tmp_path):
    expected = {"s@r1": "banana", "s@r2": "cherry"}
    await runtime.activate(release("s", "r1", tmp_path, word_adapters["banana"]))
    swapped = asyncio.Event()
    results: list[tuple[str, str | None]] = []

    async def client(i):
        after = 0
        while after < 3:
            results.append(await ask(runtime, text=PROMPTS[i % len(PROMPTS)]))
            if swapped.is_set():
                after += 1

    clients = [asyncio.create_task(client(i)) for i in range(4)]
    await wait_until(lambda: len(results) >= 8, "the clients have been served on r1")
    await runtime.activate(release("s", "r2", tmp_path, word_adapters["cherry"]))
    swapped.set()
    await asyncio.gather(*clients)  # any failed request would raise here

    assert {a for _, a in results} == {"s@r1", "s@r2"}
    assert all(text == expected[adapter] for text, adapter in results)
    assert results[-1] == ("cherry", "s@r2")
    await wait_until(lambda: loaded(runtime) == {"s@r2"}, "the old adapter is deleted")


@pytest.mark.asyncio
async def test_in_flight_request_finishes_on_its_adapter_then_old_one_is_deleted(runtime, word_adapters, tmp_path):
    await runtime.activate(release("s", "r1", tmp_path, word_adapters["banana"]))
    engine = runtime.engine
    gate = Gate(engine, lambda row: row.req.adapter == "s@r1" and len(row.tokens) == 1)
    in_flight = asyncio.create_task(ask(runtime))
    await gate.wait()  # the r1 request has sampled "banana", its end token is still to come

    swap = asyncio.create_task(runtime.activate(release("s", "r2", tmp_path, word_adapters["cherry"])))
    await wait_until(lambda: len(engine._commands) == 1, "the adapter load is queued")
    parked = Blocker(engine)  # runs right after the load, with the r1 request still in the batch
    gate.open()
    await parked.wait()
    await swap
    assert loaded(runtime) == {"s@r1", "s@r2"}  # r1 is still held by the in-flight request
    assert runtime.serving()["_draining"] == {"s@r1": 1}
    assert runtime.serving()["s"]["adapter"] == "s@r2"

    newcomer = asyncio.create_task(ask(runtime))
    await wait_until(lambda: len(engine._pending) == 1, "the new request is queued")
    parked.open()
    assert await in_flight == ("banana", "s@r1")
    assert await newcomer == ("cherry", "s@r2")
    await wait_until(lambda: loaded(runtime) == {"s@r2"}, "r1 is deleted once drained")
    assert runtime.serving()["_draining"] == {}


@pytest.mark.asyncio
async def test_two_scenarios_side_by_side_in_one_batch_do_not_mix(runtime, word_adapters, tmp_path):
    await runtime.activate(release("a", "r1", tmp_path, word_adapters["banana"]))
    await runtime.activate(release("b", "r1", tmp_path, word_adapters["cherry"]))
    base_answers = {p: (await ask(runtime, scenario="c", text=p))[0] for p in PROMPTS}
    runtime.engine.forward_log.clear()
    scenarios = ["a", "b", "c"] * 3
    outs = await asyncio.gather(*(ask(runtime, scenario=s, text=PROMPTS[i % 5]) for i, s in enumerate(scenarios)))
    want = {"a": ("banana", "a@r1"), "b": ("cherry", "b@r1")}
    for i, (s, (text, adapter)) in enumerate(zip(scenarios, outs)):
        if s == "c":
            assert (text, adapter) == (base_answers[PROMPTS[i % 5]], None)
        else:
            assert (text, adapter) == want[s]
    # rows of all three (two adapters and the base) shared forwards
    assert max(n for _, n in runtime.engine.forward_log) >= 3


@pytest.mark.asyncio
async def test_frozen_release_on_the_call_wins_while_resident(runtime, word_adapters, tmp_path):
    r1 = release("s", "r1", tmp_path, word_adapters["banana"])
    await runtime.activate(r1)
    engine = runtime.engine
    gate = Gate(engine, lambda row: row.req.adapter == "s@r1" and len(row.tokens) == 1)
    holder = asyncio.create_task(ask(runtime))
    await gate.wait()
    swap = asyncio.create_task(runtime.activate(release("s", "r2", tmp_path, word_adapters["cherry"])))
    await wait_until(lambda: len(engine._commands) == 1, "the adapter load is queued")
    parked = Blocker(engine)
    gate.open()
    await parked.wait()
    await swap  # r2 serves now; r1 drains, held by `holder`
    c = InferenceCall(
        scenario="s", record_id="x", release=r1, body={"messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    )
    frozen = asyncio.create_task(runtime.complete(c))
    await wait_until(lambda: len(engine._pending) == 1, "the frozen-release request is queued")
    parked.open()
    await holder
    out = await frozen
    assert (out["choices"][0]["message"]["content"], c.extras["adapter"]) == ("banana", "s@r1")
    assert await ask(runtime) == ("cherry", "s@r2")


@pytest.mark.asyncio
async def test_bad_adapter_dir_is_a_clear_error_and_serving_continues(runtime, tmp_path):
    path = tmp_path / "broken"
    (path / "adapter").mkdir(parents=True)
    with pytest.raises(RuntimeCallError, match="adapter_config.json"):
        await runtime.activate(ActiveRelease(scenario="s", release_id="bad", path=path))
    (path / "adapter" / "adapter_config.json").write_text("{}")
    with pytest.raises(RuntimeCallError, match="Could not load the adapter"):
        await runtime.activate(ActiveRelease(scenario="s", release_id="bad", path=path))
    text, adapter = await ask(runtime)
    assert adapter is None and text


def lora_weight(rt, name):
    layer = rt.engine.model.get_base_model().model.layers[0].self_attn.q_proj
    return layer.lora_A[name].weight


@pytest.mark.asyncio
async def test_rollback_while_the_old_version_drains_revives_it_without_reloading(runtime, word_adapters, tmp_path):
    r1 = release("s", "r1", tmp_path, word_adapters["banana"])
    await runtime.activate(r1)
    weight = lora_weight(runtime, "s@r1")
    engine = runtime.engine
    gate = Gate(engine, lambda row: row.req.adapter == "s@r1" and len(row.tokens) == 1)
    held = asyncio.create_task(ask(runtime))
    await gate.wait()
    to_r2 = asyncio.create_task(runtime.activate(release("s", "r2", tmp_path, word_adapters["cherry"])))
    await wait_until(lambda: len(engine._commands) == 1, "the swap to r2 is queued")
    parked = Blocker(engine)
    gate.open()
    await parked.wait()
    await to_r2
    assert runtime.serving()["_draining"] == {"s@r1": 1}

    back = asyncio.create_task(runtime.activate(r1))  # rollback while r1 still serves `held`
    await wait_until(lambda: len(engine._commands) == 1, "the rollback is queued")
    parked.open()
    await back
    assert await held == ("banana", "s@r1")
    assert loaded(runtime) == {"s@r1"}  # r2 unloaded at once (unused), r1 kept
    assert lora_weight(runtime, "s@r1") is weight  # revived, not loaded again
    assert await ask(runtime) == ("banana", "s@r1")


@pytest.mark.asyncio
async def test_candidate_release_on_the_call_is_loaded_for_it_alone(runtime, word_adapters, tmp_path):
    """An evaluator runs a candidate that is not serving: its adapter serves only those calls."""
    base_answer, _ = await ask(runtime)
    candidate = release("s", "candidate:c1", tmp_path, word_adapters["banana"])

    async def ask_candidate(text="hello"):
        c = InferenceCall(
            scenario="s",
            record_id="x",
            release=candidate,
            body={"messages": [{"role": "user", "content": text}], "temperature": 0},
        )
        out = await runtime.complete(c)
        return out["choices"][0]["message"]["content"], c.extras["adapter"]

    results = await asyncio.gather(*(ask_candidate(t) for t in PROMPTS[:3]), ask(runtime))
    assert results[:3] == [("banana", "s@candidate:c1")] * 3
    assert results[3] == (base_answer, None)  # serving never saw the candidate
    assert loaded(runtime) == set()  # unloaded once its last request left
    assert runtime.serving()["s"]["release_id"] is None


@pytest.mark.asyncio
async def test_a_release_without_an_artifact_serves_the_frozen_base(runtime, word_adapters, tmp_path):
    """What a judge on the base model relies on: a call naming a release without an artifact gets
    the base model, while the scenario keeps serving its adapter to everyone else."""
    base_answer, _ = await ask(runtime)
    await runtime.activate(release("s", "r1", tmp_path, word_adapters["banana"]))
    c = InferenceCall(scenario="s", record_id="judge", release=ActiveRelease("s", "judge-base", "", None),
                      body={"messages": [{"role": "user", "content": "hello"}], "temperature": 0})
    out = await runtime.complete(c)
    assert (out["choices"][0]["message"]["content"], c.extras["adapter"]) == (base_answer, None)
    assert await ask(runtime) == ("banana", "s@r1")
    assert runtime.serving()["s"]["release_id"] == "r1"


def test_a_request_leaving_while_the_runtime_closes_unloads_nothing_and_raises_nothing():
    """``aclose`` drops the engine before the last requests leave the batch; their adapters go
    with the model, so unloading one then is a no-op (it raised on the missing engine and was
    logged as a failed callback at every shutdown)."""
    runtime = LocalRuntime()
    assert runtime.engine is None
    runtime._unload_adapter("bench@rel_gone")  # no AttributeError


def _misfit(rel: ActiveRelease) -> ActiveRelease:
    """``rel`` with adapter weights shaped for another base model (its config still reads fine)."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = rel.adapter_dir / "adapter_model.safetensors"
    save_file({k: torch.zeros(v.shape[0] + 3, *v.shape[1:]) for k, v in load_file(weights).items()}, weights)
    return rel


def _renamed(rel: ActiveRelease) -> ActiveRelease:
    """``rel`` with adapter weights named for modules this model does not have (peft only warns)."""
    from safetensors.torch import load_file, save_file

    weights = rel.adapter_dir / "adapter_model.safetensors"
    save_file({k.replace(".layers.", ".blocks."): v for k, v in load_file(weights).items()}, weights)
    return rel


@pytest.mark.asyncio
@pytest.mark.parametrize("spoil", [_misfit, _renamed], ids=["misshapen", "misnamed"])
@pytest.mark.parametrize("first", [False, True], ids=["plain-model", "beside-an-adapter"])
async def test_an_adapter_that_fails_to_load_leaves_nothing_behind_and_fails_again(runtime, word_adapters, tmp_path,
                                                                                   first, spoil):
    """peft adds an adapter's layers before it reads the weights: a load that failed there left them
    (randomly initialized) in the model, and the next activation of that release, the follower's
    retry, skipped the load as done: the scenario then served those layers as the release (beside
    another adapter), or every request of it failed (on the plain model, which is no PeftModel)."""
    if first:
        await runtime.activate(release("a", "r1", tmp_path, word_adapters["banana"]))
    before = loaded(runtime)
    base_answer, _ = await ask(runtime, scenario="other")
    bad = spoil(release("s", "bad", tmp_path, word_adapters["cherry"]))
    for _ in range(2):  # the follower retries the chain's head
        with pytest.raises(RuntimeCallError, match="Could not load the adapter"):
            await runtime.activate(bad)
        assert loaded(runtime) == before
        assert hasattr(runtime.engine.model, "peft_config") == first
    assert await ask(runtime) == (base_answer, None)
    assert runtime.serving()["s"]["release_id"] is None
    assert await ask(runtime, scenario="other") == (base_answer, None)
    await runtime.activate(release("s", "r2", tmp_path, word_adapters["banana"]))
    assert await ask(runtime) == ("banana", "s@r2")


@pytest.mark.asyncio
@pytest.mark.parametrize("when", ["while-loading", "as-the-load-ends"])
async def test_a_call_cancelled_while_its_release_loads_holds_nothing(runtime, word_adapters, tmp_path, when):
    """A call whose release is not resident waits for the worker to load it; a caller that left
    then (a client gone, an evaluation timed out) lost the hold the load took: the version never
    drained and its adapter stayed in the model for good."""
    import threading

    candidate = release("s", "candidate:c1", tmp_path, word_adapters["banana"])
    loop = asyncio.get_running_loop()
    started, go = threading.Event(), threading.Event()
    load = runtime._load_adapter

    def slow_load(name, path):
        started.set()
        go.wait(60)
        load(name, path)
        if when == "as-the-load-ends":
            loop.call_soon_threadsafe(call.cancel)  # before the load's result reaches the loop

    runtime._load_adapter = slow_load
    call = asyncio.create_task(ask_on(runtime, candidate))
    assert await asyncio.to_thread(started.wait, 60)
    if when == "while-loading":
        call.cancel()
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    after_load = Blocker(runtime.engine)  # commands run in order: the load has ended
    await after_load.wait()
    after_load.open()
    await wait_until(lambda: runtime.serving()["_draining"] == {}, "the candidate's version is given back")
    await wait_until(lambda: loaded(runtime) == set(), "the candidate's adapter is unloaded")
    runtime._load_adapter = load
    assert await ask_on(runtime, candidate) == ("banana", "s@candidate:c1")  # and loads again when asked
    assert loaded(runtime) == set()


async def ask_on(rt, rel: ActiveRelease, text: str = "hello"):
    c = InferenceCall(scenario=rel.scenario, record_id="x", release=rel,
                      body={"messages": [{"role": "user", "content": text}], "temperature": 0})
    out = await rt.complete(c)
    return out["choices"][0]["message"]["content"], c.extras["adapter"]


@pytest.mark.asyncio
async def test_a_frozen_release_whose_files_are_gone_is_refused_not_run_on_the_base(runtime, word_adapters, tmp_path):
    """The chain keeps the newest few materialized releases (``KEEP_MATERIALIZED``): a request
    frozen on a release that was swapped out, drained and pruned before the runtime took it up
    found no ``adapter/`` and ran on the base model, while its record named the release."""
    import shutil

    r1 = release("s", "r1", tmp_path, word_adapters["banana"])
    await runtime.activate(r1)
    await runtime.activate(release("s", "r2", tmp_path, word_adapters["cherry"]))
    assert loaded(runtime) == {"s@r2"}  # r1 drained
    shutil.rmtree(r1.path)  # pruned by later swaps
    with pytest.raises(RuntimeCallError, match="r1") as err:
        await ask_on(runtime, r1)
    assert err.value.status == 503
    assert runtime.serving()["_draining"] == {} and loaded(runtime) == {"s@r2"}
    assert await ask(runtime) == ("cherry", "s@r2")
