"""The learner's memory savings leave the loss and the gradient as they were: a micro-batched
step against a whole-batch step (the chunked head + log-softmax against the one-shot one is
reef-train's: plugins/reef_train/tests/test_train_logprobs.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from reef_recipe_tttd import Rollout, TTTDRecipe
from reef_train import Learner
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
    recipe = TTTDRecipe(lr=1e-2, lora_rank=4, lora_alpha=8, lora_lm_head=True, **options)
    return Learner(recipe.algorithm, recipe.lora, SimpleNamespace(path=model_dir, device="cpu"), pad_id=0)


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


def test_the_recipe_checks_the_micro_batch_budget():
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        TTTDRecipe(micro_batch_tokens=0)
    assert TTTDRecipe(micro_batch_tokens=64).algorithm.micro_batch_tokens == 64
