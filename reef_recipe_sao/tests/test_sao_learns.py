"""SAO on a toy verifiable task with the tiny model: answering with a digit first scores 1.
Each round samples fresh single rollouts from the release the previous round produced, as a
serving Reef would, and the recipe's candidate becomes the next release."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch
from transformers import AutoTokenizer

from reef_core import content_hash
from reef_core.testing import reef_settings
from reef_recipe_sao import SAORecipe
from reef_recipe_sao.testing import context, release_of, sampled_batch
from reef_train import load_policy
from reef_train.testing import prompt_ids

PROMPTS = ["one", "two", "three", "four", "five", "six", "seven", "eight"]


def digit_mass(model_dir, adapter_dir, prompts, digits) -> float:
    """The policy's probability that an answer starts with a digit, averaged over ``prompts``:
    the expected reward, exactly (no sampling noise)."""
    policy = load_policy(model_dir, adapter_dir)
    policy.eval()
    with torch.no_grad():
        total = 0.0
        for p in prompts:
            logits = policy(input_ids=torch.tensor([p])).logits[0, -1]
            total += float(torch.softmax(logits, -1)[sorted(digits)].sum())
    return total / len(prompts)


@pytest.fixture
def unbounded(tmp_path):
    """Settings without the divergence guard's KL bound: these tests take huge steps on purpose
    (lr 0.05 on a tiny model: one step moves the policy about 4 nats per token from serving)."""
    return reef_settings(tmp_path / "settings", ["loop.lineage_max_kl=null"])


def test_expected_reward_rises(tmp_path, tiny_model_dir, trainable_runtime, unbounded):
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    prompts = [prompt_ids(tok, w) for w in PROMPTS]
    digits = set(tok.convert_tokens_to_ids(list("0123456789")))
    recipe = SAORecipe(batch_size=8, lr=0.05, critic_lr=0.01, num_critic_only_steps=1, lora_rank=4, lora_alpha=8,
                       lora_lm_head=True, state_dir=tmp_path / "state")
    current = None
    before = digit_mass(tiny_model_dir, None, prompts, digits)
    rewards = []
    for i in range(8):
        adapter = current.adapter_dir if current else None
        batch = sampled_batch(tiny_model_dir, prompts, lambda r: float(r[0] in digits), adapter_dir=adapter,
                              release_id=current.release_id if current else None, seed=100 + i, max_new_tokens=2)
        rewards.append(sum(e.score for e in batch) / len(batch))
        cand = recipe.propose(batch, current, context(tmp_path, current, trainable_runtime, f"s{i}", unbounded))
        if cand is None:
            continue
        dest = tmp_path / f"rel{i}"
        shutil.copytree(cand.artifact_dir, dest)
        current = replace(release_of(dest, f"rel{i}"), content_hash=content_hash(dest))  # published
    after = digit_mass(tiny_model_dir, current.adapter_dir, prompts, digits)
    assert after > before + 0.3, (before, after, rewards)   # measured here: 0.13 -> 0.70
    assert recipe.lineages.head("kit").last_reset is None       # each release was its own snapshot


def test_learning_accumulates_on_the_lineage_while_every_candidate_is_rejected(tmp_path, tiny_model_dir, unbounded,
                                                                               trainable_runtime):
    """Serving never changes (the gate rejects everything) and every rollout comes from it: the
    lineage still learns, off-policy (DIS against the recorded logprobs), step after step."""
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    prompts = [prompt_ids(tok, w) for w in PROMPTS]
    digits = set(tok.convert_tokens_to_ids(list("0123456789")))
    recipe = SAORecipe(batch_size=8, lr=0.05, critic_lr=0.01, num_critic_only_steps=1, lora_rank=4, lora_alpha=8,
                       lora_lm_head=True, state_dir=tmp_path / "state")
    before = digit_mass(tiny_model_dir, None, prompts, digits)
    for i in range(8):
        batch = sampled_batch(tiny_model_dir, prompts, lambda r: float(r[0] in digits), seed=100 + i, max_new_tokens=2)
        recipe.propose(batch, None, context(tmp_path, None, trainable_runtime, f"s{i}", unbounded))  # never served
    head = recipe.lineages.head("kit")
    assert head.step == 8 and head.published_step is None
    after = digit_mass(tiny_model_dir, head.checkpoint / "adapter", prompts, digits)
    assert after > before + 0.3, (before, after)   # measured here: 0.13 -> 0.89
