"""The convention between the runtime and the training toolkit: the sampling logprobs the
runtime records (``call.extras["logprobs"]``) are what ``reef_train`` recomputes for the same
tokens, base or adapter, greedy or sampled, batched, at any temperature."""

from __future__ import annotations

import asyncio

import pytest
import torch
from reef_torch_testing import release
from transformers import AutoTokenizer

from reef_core import InferenceCall
from reef_torch import LocalRuntime
from reef_train import Sample, collate, importance_ratios, load_trainable, response_logprobs, token_logprobs
from reef_train.testing import train_word_adapter

PROMPTS = ["hello", "what is two plus two?", "tell me a story", "hi there"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


async def record(rt, scenario, text, **body):
    c = InferenceCall(
        scenario=scenario, record_id="r", body={"messages": [{"role": "user", "content": text}], "max_tokens": 16, **body}
    )
    await rt.complete(c)
    e = c.extras
    return Sample(e["prompt_token_ids"], e["response_token_ids"], e["logprobs"]), e


@pytest.mark.asyncio
@pytest.mark.parametrize("with_adapter", [False, True])
async def test_recompute_matches_recorded_sampling_logprobs(tiny_model_dir, tokenizer, tmp_path, with_adapter):
    adapter = train_word_adapter(tiny_model_dir, tmp_path / "art", "mango", PROMPTS[:2], steps=15) if with_adapter else None
    rt = LocalRuntime(model=str(tiny_model_dir), device="cpu")
    await rt.start()
    served = release("s", "r1", tmp_path, adapter) if adapter is not None else None
    if served is not None:
        await rt.activate(served)
    recorded = {}
    # greedy and sampled at T=1 (several at once, so batched rows are covered), then T=0.7
    for t, seeds in ((0, [None]), (1.0, [1, 2, 3]), (0.7, [4])):
        outs = await asyncio.gather(*(record(rt, "s", p, temperature=t, seed=s) for p in PROMPTS for s in seeds))
        recorded[t] = outs
    base = rt.base_model()
    policy = load_trainable(base, rt.adapter_of(served))  # a separate training copy of the served base
    assert base.eos_token_ids == (tokenizer.eos_token_id,)
    await rt.aclose()
    assert all(e["adapter"] == ("s@r1" if adapter else None) for outs in recorded.values() for _, e in outs)

    for t, outs in recorded.items():
        samples = [s for s, _ in outs]
        recomputed = response_logprobs(policy, samples, tokenizer.pad_token_id, temperature=t)
        for s, lp in zip(samples, recomputed):
            assert len(lp) == len(s.logprobs)
            assert lp == pytest.approx(s.logprobs, abs=2e-4)
        batch = collate(samples, tokenizer.pad_token_id)
        with torch.no_grad():
            ratios = importance_ratios(token_logprobs(policy, batch, t), batch.old_logprobs, batch.response_mask)
        assert torch.allclose(ratios, torch.ones_like(ratios), atol=1e-3)


@pytest.mark.asyncio
async def test_top_logprobs_only_when_asked_and_in_the_same_convention(tiny_model_dir, tokenizer):
    rt = LocalRuntime(model=str(tiny_model_dir), device="cpu", batch_window_ms=50)

    async def call(text: str, k: int, seed: int):
        c = InferenceCall(scenario="s", record_id="r", top_logprobs=k,
                          body={"messages": [{"role": "user", "content": text}], "max_tokens": 8,
                                "temperature": 0.7, "seed": seed})
        await rt.complete(c)
        return c.extras

    await rt.start()
    # batched together: a row that asks next to one that does not
    asked, plain = await asyncio.gather(call(PROMPTS[0], 4, 1), call(PROMPTS[1], 0, 2))
    policy = load_trainable(rt.base_model())
    await rt.aclose()
    assert "top_logprobs" not in plain
    top = asked["top_logprobs"]
    assert len(top) == len(asked["response_token_ids"])
    sample = Sample(asked["prompt_token_ids"], asked["response_token_ids"], asked["logprobs"])
    batch = collate([sample], tokenizer.pad_token_id)
    with torch.no_grad():
        logits = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[0, :-1]
        logp = torch.log_softmax(logits.float() / 0.7, dim=-1)
    start = len(sample.prompt_ids) - 1
    for t, (pairs, tok, lp) in enumerate(zip(top, sample.response_ids, sample.logprobs)):
        assert len(pairs) == 4
        values = [v for _, v in pairs]
        assert values == sorted(values, reverse=True)
        expected = logp[start + t].topk(4)
        assert [int(i) for i, _ in pairs] == expected.indices.tolist()
        assert values == pytest.approx(expected.values.tolist(), abs=2e-4)
        if tok in [int(i) for i, _ in pairs]:  # the sampled token's entry is its recorded logprob
            assert dict((int(i), v) for i, v in pairs)[tok] == pytest.approx(lp, abs=1e-5)
