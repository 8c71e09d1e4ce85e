"""``reef_train.logprobs``, the one place weight recipes take logprobs from: one temperature or
one per row, chunked against one-shot (values and gradients), the full distribution of one
sequence, and the sampling side's convention being the same function."""

from __future__ import annotations

import pytest
import torch

from reef_train import (
    Sample,
    collate,
    load_policy,
    make_generator,
    sample_rows,
    scaled_log_softmax,
    token_logprobs,
    vocab_logprobs,
)
from reef_train.testing import prompt_ids

TEMPS = (0.7, 1.0, 0.0, 1.3)


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    policy = load_policy(tiny_model_dir, r=4, alpha=8, include_lm_head=True, seed=0)
    with torch.no_grad():  # a non-zero LoRA (B starts at 0), so its gradients are not trivially alike
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return policy


@pytest.fixture(scope="module")
def samples(tokenizer):
    """Eight samples of different prompt and response lengths."""
    gen = torch.Generator().manual_seed(0)
    prompts = [prompt_ids(tokenizer, "pack"), prompt_ids(tokenizer, "pack the circles tightly, please")]
    out = []
    for g, prompt in enumerate(prompts):
        for r in range(4):
            n = 2 + (3 * g + r) % 5
            response = torch.randint(5, len(tokenizer), (n,), generator=gen).tolist()
            out.append(Sample(prompt, response, [-2.0 - 0.1 * i for i in range(n)]))
    return out


def test_the_convention_one_temperature_or_one_per_row():
    logits = torch.randn(4, 3, 11, generator=torch.Generator().manual_seed(1))
    per_row = scaled_log_softmax(logits, torch.tensor(TEMPS))
    for i, t in enumerate(TEMPS):
        expected = torch.log_softmax(logits[i] / (t if t > 0 else 1.0), dim=-1)  # greedy (0) is taken at T = 1
        assert torch.equal(per_row[i], expected)
        assert torch.equal(scaled_log_softmax(logits[i], t), expected)
    assert torch.equal(scaled_log_softmax(logits, list(TEMPS)), per_row)
    assert scaled_log_softmax(logits.half(), 1.0).dtype == torch.float32


def test_the_sampling_side_records_the_same_function():
    logits = torch.randn(4, 11, generator=torch.Generator().manual_seed(2))
    tokens, logprobs = sample_rows(logits, list(TEMPS), [1.0] * 4, [make_generator(i) for i in range(4)])
    expected = scaled_log_softmax(logits, torch.tensor(TEMPS)).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
    assert logprobs == expected.tolist()


def test_per_row_temperatures_are_each_rows_own(policy, samples):
    temps = [TEMPS[i % 4] for i in range(len(samples))]
    batch = collate(samples, 0)
    with torch.no_grad():
        rows = token_logprobs(policy, batch, torch.tensor(temps))
        for i, t in enumerate(temps):
            assert torch.allclose(rows[i], token_logprobs(policy, batch, t)[i], atol=1e-6)
        # the full distribution of one sequence, gathered at its tokens, is the same
        s = samples[3]
        full = vocab_logprobs(policy, s.prompt_ids, s.response_ids, temps[3])
        start = len(s.prompt_ids) - 1
        assert full.shape == (len(s.response_ids), len(policy.get_base_model().lm_head.base_layer.weight))
        picked = full.gather(-1, torch.tensor(s.response_ids)[:, None]).squeeze(-1)
        assert torch.allclose(picked, rows[3, start:start + len(s.response_ids)], atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_chunked_logprobs_and_gradients_equal_the_one_shot_ones(policy, samples, chunk):
    batch = collate(samples, 0)
    temps = torch.tensor([TEMPS[i % 4] for i in range(len(samples))])
    adv = batch.response_mask * torch.linspace(-1, 1, batch.targets.shape[0])[:, None]
    results = []
    for chunk_tokens in (None, chunk):
        policy.zero_grad(set_to_none=True)
        logp = token_logprobs(policy, batch, temps, chunk_tokens=chunk_tokens)
        loss = -(torch.exp((logp - batch.old_logprobs) * batch.response_mask) * adv).sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        results.append((logp.detach(), loss.item(), grads))
    policy.zero_grad(set_to_none=True)
    (full, full_loss, full_grads), (chunked, chunked_loss, chunked_grads) = results
    assert torch.allclose(chunked, full, atol=1e-5)
    assert chunked_loss == pytest.approx(full_loss, rel=1e-5)
    assert full_grads.keys() == chunked_grads.keys() and any("lm_head" in n for n in full_grads)
    for name, g in full_grads.items():
        assert torch.allclose(chunked_grads[name], g, atol=1e-6, rtol=1e-4), name
    with torch.no_grad():  # and without gradients, the chunks are not checkpointed
        assert torch.allclose(token_logprobs(policy, batch, temps, chunk_tokens=chunk), full, atol=1e-5)
