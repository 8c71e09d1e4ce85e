"""The learner's memory savings leave the loss and the gradient as they were: chunked head +
log-softmax against the one-shot one, and a micro-batched step against a whole-batch step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from reef_recipe_tttd import Learner, LearnerOptions, Rollout
from reef_recipe_tttd.learner import micro_batches
from reef_recipe_tttd.loss import full_row_logprobs, importance_sampling_loss, row_logprobs
from reef_train import Sample, collate
from reef_train.testing import prompt_ids


@pytest.fixture(scope="module")
def groups(tokenizer):
    """Two groups of four rollouts of different prompt and response lengths and temperatures."""
    gen = torch.Generator().manual_seed(0)
    prompts = [prompt_ids(tokenizer, "pack"), prompt_ids(tokenizer, "pack the circles tightly, please")]
    out = []
    for g, prompt in enumerate(prompts):
        group = []
        for r in range(4):
            n = 2 + (3 * g + r) % 5
            response = torch.randint(5, len(tokenizer), (n,), generator=gen).tolist()
            group.append(Rollout(prompt, response, [-2.0 - 0.1 * i for i in range(n)], reward=float((r * 7 + g) % 4),
                                 temperature=(0.7, 1.0, 0.0, 1.3)[r]))
        out.append(group)
    return out


def _learner(model_dir, **options):
    base = SimpleNamespace(path=model_dir, device="cpu")
    return Learner(LearnerOptions(lr=1e-2, lora_rank=4, lora_alpha=8, lora_lm_head=True, **options), base, None, None,
                   pad_id=0)


def _batch(groups):
    rollouts = [r for g in groups for r in g]
    batch = collate([Sample(r.prompt_ids, r.response_ids, r.logprobs) for r in rollouts], 0)
    return batch, torch.tensor([r.temperature for r in rollouts])


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_chunked_logprobs_and_gradients_equal_the_one_shot_ones(tiny_model_dir, groups, chunk):
    policy = _learner(tiny_model_dir).policy
    with torch.no_grad():  # a non-zero LoRA (B starts at 0), so its gradients are not trivially alike
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    batch, temps = _batch(groups)
    adv = batch.response_mask * torch.linspace(-1, 1, batch.targets.shape[0])[:, None]
    results = []
    for fn in (full_row_logprobs, lambda m, b, t: row_logprobs(m, b, t, chunk_tokens=chunk)):
        policy.zero_grad(set_to_none=True)
        logp = fn(policy, batch, temps)
        loss, _ = importance_sampling_loss(logp, batch.old_logprobs, adv, batch.response_mask)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        results.append((logp.detach(), loss.item(), grads))
    (full, full_loss, full_grads), (chunked, chunked_loss, chunked_grads) = results
    assert torch.allclose(chunked, full, atol=1e-5)
    assert chunked_loss == pytest.approx(full_loss, rel=1e-5)
    assert full_grads.keys() == chunked_grads.keys() and any("lm_head" in n for n in full_grads)
    for name, g in full_grads.items():
        assert torch.allclose(chunked_grads[name], g, atol=1e-6, rtol=1e-4), name


def test_a_micro_batched_step_equals_a_whole_batch_step(tiny_model_dir, groups):
    whole, rows = _learner(tiny_model_dir, micro_batch_tokens=1_000_000), _learner(tiny_model_dir, micro_batch_tokens=1)
    lora = lambda learner: {n: p.detach().clone() for n, p in learner.policy.named_parameters() if "lora_" in n}  # noqa: E731
    assert all(torch.equal(a, b) for a, b in zip(lora(whole).values(), lora(rows).values()))  # same seeded start
    m_whole, m_rows = whole.step(groups), rows.step(groups)
    for key in ("loss", "grad_norm", "kl_sampled", "ratio_mean", "rollout_logprob_abs_diff"):
        assert m_rows[key] == pytest.approx(m_whole[key], rel=1e-4, abs=1e-6), key
    assert m_rows["trained_tokens"] == m_whole["trained_tokens"] == sum(len(r.response_ids) for g in groups for r in g)
    after_whole, after_rows = lora(whole), lora(rows)
    for name, p in after_whole.items():
        assert torch.allclose(after_rows[name], p, atol=1e-6), name
    # and the step did move the LoRA (the comparison is not between two untouched adapters)
    assert any(not torch.equal(p, q) for p, q in zip(after_whole.values(), lora(_learner(tiny_model_dir)).values()))


def test_micro_batches_keep_rows_times_longest_within_the_budget():
    lengths = [5, 9, 3, 9, 4, 20]
    parts = micro_batches(lengths, 18)
    assert sorted(i for p in parts for i in p) == list(range(6))
    assert parts[0] == [5]  # longer than the budget: alone
    for p in parts[1:]:
        assert len(p) * max(lengths[i] for i in p) <= 18
    assert micro_batches(lengths, 10_000) == [[5, 1, 3, 0, 4, 2]]
    assert micro_batches(lengths, 1) == [[5], [1], [3], [0], [4], [2]]


def test_the_recipe_checks_the_micro_batch_budget():
    from reef_recipe_tttd import TTTDRecipe

    with pytest.raises(ValueError, match="micro_batch_tokens"):
        TTTDRecipe(micro_batch_tokens=0)
    assert TTTDRecipe(micro_batch_tokens=64).options.micro_batch_tokens == 64
