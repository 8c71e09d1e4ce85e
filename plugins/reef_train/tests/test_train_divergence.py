"""``reef_train.divergence``: the KL of a trained policy to what serves, on rollouts serving
sampled, with the one logprob function: zero against itself, growing as the policy moves, the
same with a serving adapter as with a second model, and the policy left as it was."""

from __future__ import annotations

import pytest
import torch

from reef_train import Sample, collate, kl_to_reference, load_policy, token_logprobs
from reef_train.testing import prompt_ids, sample_rollouts, word_learner, word_samples

PROMPTS = ["one", "two", "three", "four", "five"]


def _nudged(policy, scale: float) -> None:
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * scale)


@pytest.fixture(scope="module")
def rollouts(tiny_model_dir, tokenizer):
    """Rollouts the base sampled (at temperature 1), as the traffic of a base that serves."""
    prompts = [prompt_ids(tokenizer, p) for p in PROMPTS]
    rows = sample_rollouts(tiny_model_dir, prompts, seed=0, max_new_tokens=6)
    return [Sample(r.prompt_ids, r.response_ids, r.logprobs) for r in rows]


def test_a_fresh_policy_is_at_kl_zero_and_a_moved_one_is_not(tiny_model_dir, rollouts):
    policy = load_policy(tiny_model_dir, r=4, alpha=8, include_lm_head=True, seed=0)
    assert kl_to_reference(policy, rollouts, pad_id=0) == pytest.approx(0.0, abs=1e-7)   # LoRA B starts at 0
    kls = []
    for scale in (0.01, 0.05, 0.2):
        _nudged(policy, scale)
        kls.append(kl_to_reference(policy, rollouts, pad_id=0, temperature=[1.0] * len(rollouts)))
    assert 0 < kls[0] < kls[1] < kls[2]
    assert policy.active_adapter == "default"


def test_against_a_serving_adapter_it_matches_a_second_model_and_leaves_the_policy_trainable(
        tiny_model_dir, tokenizer, rollouts, tmp_path):
    serving = word_learner(tiny_model_dir, lr=5e-2, r=4)
    for _ in range(5):
        serving.step(word_samples(tokenizer, "yes", PROMPTS))
    serving_dir = serving.save(tmp_path / "serving") / "adapter"
    policy = load_policy(tiny_model_dir, serving_dir, r=4, alpha=8, include_lm_head=True, seed=0)
    trainable = sorted(n for n, p in policy.named_parameters() if p.requires_grad)
    # the policy is serving's own adapter: no distance at all
    assert kl_to_reference(policy, rollouts, pad_id=0, reference_adapter=serving_dir) == pytest.approx(0, abs=1e-6)
    _nudged(policy, 0.05)
    kl = kl_to_reference(policy, rollouts, pad_id=0, reference_adapter=serving_dir)
    # the same estimate with serving as a model of its own
    other = load_policy(tiny_model_dir, serving_dir, r=4, alpha=8, include_lm_head=True, seed=0)
    batch = collate(rollouts, 0, "cpu")
    with torch.no_grad():
        log_ratio = token_logprobs(policy, batch) - token_logprobs(other, batch)
    mask = batch.response_mask.float()
    expected = float(((log_ratio.exp() - 1 - log_ratio) * mask).sum() / mask.sum())
    assert kl == pytest.approx(expected, rel=1e-4) and kl > 0
    assert policy.active_adapter == "default" and list(policy.peft_config) == ["default"]
    assert sorted(n for n, p in policy.named_parameters() if p.requires_grad) == trainable
