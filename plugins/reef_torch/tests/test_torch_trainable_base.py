"""The local runtime is a ``reef_core.TrainableBase``: a weight recipe reaches the served model
through ``base_model()`` and ``adapter_of(release)`` alone and trains it with ``reef_train``."""

from __future__ import annotations

import pytest
import torch
from reef_torch_testing import release
from transformers import AutoTokenizer

from reef_core import (
    InferenceCall,
    RuntimeCallError,
    RuntimeUnavailable,
    ServedBase,
    TrainableBase,
    require_trainable,
    trainable_base,
)
from reef_core.testing import check_trainable_base
from reef_torch import LocalRuntime
from reef_train import load_tokenizer, load_trainable, trainable_parameters
from reef_train.testing import prompt_ids, train_word_adapter

PROMPTS = ["hello", "hi there"]


@pytest.fixture(scope="module")
def banana_adapter(tiny_model_dir, tmp_path_factory):
    return train_word_adapter(tiny_model_dir, tmp_path_factory.mktemp("banana"), "banana", PROMPTS, steps=80)


@pytest.fixture
async def runtime(tiny_model_dir):
    rt = LocalRuntime(model=str(tiny_model_dir), device="cpu", max_new_tokens_default=8)
    yield rt
    await rt.aclose()


async def greedy_tokens(rt, text: str) -> list[int]:
    c = InferenceCall(scenario="s", record_id="r", body={"messages": [{"role": "user", "content": text}], "temperature": 0})
    await rt.complete(c)
    return c.extras["response_token_ids"]


def next_token(policy, tokenizer, text: str) -> int:
    ids = torch.tensor([prompt_ids(tokenizer, text)])
    with torch.no_grad():
        return int(policy(input_ids=ids).logits[0, -1].argmax())


@pytest.mark.asyncio
async def test_local_runtime_keeps_the_capability(runtime, tiny_model_dir, tmp_path):
    assert isinstance(runtime, TrainableBase)
    assert runtime.trainable_problem() is None
    with pytest.raises(RuntimeUnavailable, match="not started"):
        runtime.base_model()  # the model directory is resolved (and, embedded, converted) by start()
    await runtime.start()
    base = check_trainable_base(runtime, tmp_path)
    assert isinstance(base, ServedBase)
    assert base.path == tiny_model_dir.resolve()
    assert (base.model_id, base.device, base.dtype) == (tiny_model_dir.name, "cpu", "float32")
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert base.eos_token_ids == (tokenizer.eos_token_id,)
    assert trainable_base(runtime) is runtime and require_trainable(runtime, "sao") is runtime


@pytest.mark.asyncio
async def test_policy_from_base_model_and_adapter_of_trains_what_is_served(runtime, banana_adapter, tmp_path):
    await runtime.start()
    base = runtime.base_model()
    tokenizer = load_tokenizer(base)
    base_answer = await greedy_tokens(runtime, PROMPTS[0])

    harness_release = release("s", "r0", tmp_path, None)
    assert runtime.adapter_of(None) is None and runtime.adapter_of(harness_release) is None
    fresh = load_trainable(base, runtime.adapter_of(harness_release), r=4, seed=0)
    assert str(next(fresh.parameters()).device) == base.device
    assert trainable_parameters(fresh), "a fresh LoRA to train"
    # a fresh LoRA starts at zero: exactly the served base's behaviour
    assert next_token(fresh, tokenizer, PROMPTS[0]) == base_answer[0]

    adapter_release = release("s", "r1", tmp_path, banana_adapter)
    assert runtime.adapter_of(adapter_release) == adapter_release.adapter_dir
    await runtime.activate(adapter_release)
    served = await greedy_tokens(runtime, PROMPTS[0])
    assert tokenizer.decode(served, skip_special_tokens=True) == "banana"
    continued = load_trainable(base, runtime.adapter_of(adapter_release))
    assert trainable_parameters(continued), "training continues from the release's adapter"
    assert next_token(continued, tokenizer, PROMPTS[0]) == served[0]


@pytest.mark.asyncio
async def test_a_broken_adapter_directory_is_named(runtime, tmp_path):
    await runtime.start()
    broken = release("s", "r2", tmp_path, None)
    (broken.path / "adapter").mkdir()
    with pytest.raises(RuntimeCallError, match="adapter_config.json"):
        runtime.adapter_of(broken)
