"""The training toolkit on a tiny random model: rollout logprobs vs recompute, losses,
collate, optimizer, reference model, a PPO step through the learner, determinism, adapter
artifacts. No runtime here: the
runtime-vs-toolkit convention is checked in reef-torch's tests."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from safetensors.torch import load_file

from reef_train import (
    Algorithm,
    Learner,
    LoraOptions,
    Sample,
    clipped_surrogate,
    collate,
    dis_loss,
    dis_weights,
    importance_ratios,
    load_policy,
    make_optimizer,
    masked_mean,
    micro_batches,
    reference_logprobs,
    response_logprobs,
    rollout,
    save_adapter,
    token_logprobs,
)
from reef_train.testing import prompt_ids, train_word_adapter

PROMPTS = ["hello", "what is two plus two?", "tell me a story", "hi there"]


def test_rollout_logprobs_match_recompute(tiny_model_dir, tokenizer):
    policy = load_policy(tiny_model_dir, include_lm_head=True, seed=0)
    prompts = [prompt_ids(tokenizer, p) for p in PROMPTS]

    def sample():
        return rollout(policy, prompts, pad_id=tokenizer.pad_token_id, eos_ids=[tokenizer.eos_token_id],
                       num_samples=2, max_new_tokens=10, temperature=1.0, seed=5)

    samples = sample()
    assert len(samples) == 8 and samples[0].prompt_ids == samples[1].prompt_ids
    again = sample()  # the same seed samples the same responses
    assert [s.response_ids for s in again] == [s.response_ids for s in samples]
    recomputed = response_logprobs(policy, samples, tokenizer.pad_token_id)
    for s, lp in zip(samples, recomputed):
        assert lp == pytest.approx(s.logprobs, abs=2e-4)


def test_losses_on_hand_computed_values():
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    logp = torch.tensor([[-9.0, -1.0, -2.0], [-9.0, -9.0, -0.5]])
    adv = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, -2.0]])
    assert masked_mean(logp, mask, dim=1).tolist() == pytest.approx([-1.5, -0.5])
    assert masked_mean(adv * logp, mask).item() == pytest.approx(-2 / 3)

    old = logp.clone()
    old[0, 1] = -1.0 - math.log(2.0)  # ratio 2 on a positive advantage: clipped to 1.2
    old[1, 2] = -0.5 + math.log(2.0)  # ratio 0.5 on a negative advantage: clipped to 0.8
    ratio = importance_ratios(logp, old, mask)
    assert ratio[0].tolist() == pytest.approx([1.0, 2.0, 1.0])
    surrogate, clipped = clipped_surrogate(ratio, adv, clip_low=0.2)
    # min(r·A, clip(r)·A) per token: 1.2·1, 1·1, min(0.5·-2, 0.8·-2) = -1.6
    assert masked_mean(surrogate, mask).item() == pytest.approx((1.2 + 1.0 - 1.6) / 3)
    assert masked_mean(clipped.float(), mask).item() == pytest.approx(2 / 3)
    # clip-higher lets the ratio of 2 through up to 1 + 1.5; OpenClaw's clamp bounds the log-ratio
    assert clipped_surrogate(ratio, adv, 0.2, 1.5)[0][0, 1].item() == pytest.approx(2.0)
    assert importance_ratios(torch.tensor([30.0]), torch.tensor([0.0]), log_ratio_clamp=20.0).item() == \
        pytest.approx(math.exp(20.0))


def test_dis_band_is_strict_on_both_sides_and_weights_are_the_ratio():
    low, high = 1.0 - 0.3, 1.0 + 5.0
    ratio = torch.tensor([low, math.nextafter(low, 2.0), 1.0, math.nextafter(high, 0.0), high, 0.1, 9.0],
                         dtype=torch.float64)
    weight, kept = dis_weights(ratio, 0.3, 5.0)
    assert kept.tolist() == [False, True, True, True, False, False, False]
    assert weight.tolist() == [0.0, math.nextafter(low, 2.0), 1.0, math.nextafter(high, 0.0), 0.0, 0.0, 0.0]


def test_dis_loss_stops_the_weight_gradient_and_masks_out_of_band_tokens():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    rollout = torch.tensor([[-1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    # ratios e^0.5 (kept), e^-1 = 0.37 (below 0.7: dropped), 1 (kept); the last token is masked out
    logp = torch.tensor([[-0.5, -2.0, -1.0, -7.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[2.0, 3.0, -1.0, 5.0]], dtype=torch.float64)
    loss, stats = dis_loss(logp, rollout, adv, mask)
    r0 = math.exp(0.5)
    assert loss.item() == pytest.approx(-(r0 * 2.0 * -0.5 + 1.0 * -1.0 * -1.0) / 3)
    loss.backward()
    # d/dlogp of -sg(f)·A·logp / n: the weight itself carries no gradient
    assert logp.grad.tolist()[0] == pytest.approx([-r0 * 2.0 / 3, 0.0, 1.0 / 3, 0.0])
    assert stats["pg_clipfrac"] == pytest.approx(1 / 3)
    assert stats["rollout_logprob_abs_diff"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)


@dataclass(frozen=True)
class PPO(Algorithm):
    """PPO's clipped surrogate against the samples' recorded (behaviour) logprobs."""

    recipe: ClassVar[str] = "ppo"

    def step(self, learner, samples):
        batch = collate(samples, learner.pad_id, learner.device)
        mask = batch.response_mask
        ratio = importance_ratios(token_logprobs(learner.policy, batch), batch.old_logprobs, mask)
        surrogate, clipped = clipped_surrogate(ratio, batch.advantages)
        metrics = {"ratio_mean": float(masked_mean(ratio.detach(), mask)),
                   "clip_fraction": float(masked_mean(clipped.float(), mask))}
        metrics["grad_norm"] = learner.optimizer_step(-masked_mean(surrogate, mask))
        return learner.finish_step(metrics)


def test_optimizer_touches_lora_only_and_reference_is_the_frozen_base(tiny_model_dir, tokenizer):
    learner = Learner(PPO(), LoraOptions(lr=2e-2, lora_lm_head=True), tiny_model_dir)
    policy = learner.policy
    base_weight = policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight.detach().clone()
    samples = [
        Sample(prompt_ids(tokenizer, p), tokenizer("cherry", add_special_tokens=False)["input_ids"] + [2], advantage=1.0)
        for p in PROMPTS
    ]
    batch = collate(samples, tokenizer.pad_token_id)
    with torch.no_grad():
        before = token_logprobs(policy, batch)
    assert torch.allclose(reference_logprobs(policy, batch), before)  # fresh LoRA == base

    # PPO against the behaviour policy's logprobs (recorded once, before training)
    for s, lp in zip(samples, response_logprobs(policy, samples, tokenizer.pad_token_id)):
        s.logprobs = lp
    history = [learner.step(samples) for _ in range(10)]
    assert history[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and history[0]["clip_fraction"] == 0.0
    assert history[-1]["ratio_mean"] > 1.0 and history[-1]["clip_fraction"] > 0.0  # moved off-policy, clipped
    after_base = policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert torch.equal(after_base, base_weight)
    with torch.no_grad():
        trained = token_logprobs(policy, batch)
    assert masked_mean(trained, batch.response_mask) > masked_mean(before, batch.response_mask)
    assert torch.allclose(reference_logprobs(policy, batch), before, atol=1e-6)  # base stays frozen

    policy.get_base_model().lm_head.base_layer.weight.requires_grad_(True)
    with pytest.raises(ValueError, match="not a LoRA weight"):
        make_optimizer(policy)


def test_training_is_deterministic_and_saves_a_loadable_peft_dir(tiny_model_dir, tmp_path):
    a = train_word_adapter(tiny_model_dir, tmp_path / "a", "mango", PROMPTS, steps=8, seed=3)
    b = train_word_adapter(tiny_model_dir, tmp_path / "b", "mango", PROMPTS, steps=8, seed=3)
    c = train_word_adapter(tiny_model_dir, tmp_path / "c", "mango", PROMPTS, steps=8, seed=4)
    assert a == tmp_path / "a" / "adapter"
    assert (a / "adapter_config.json").is_file()
    wa, wb, wc = (load_file(str(d / "adapter_model.safetensors")) for d in (a, b, c))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], wc[k]) for k in wa)
    assert not any(k.endswith("base_layer.weight") for k in wa)  # save_embedding_layers=False
    assert any("lm_head.lora_A" in k for k in wa)

    policy = load_policy(tiny_model_dir, a)  # continue training from a published adapter
    assert any(p.requires_grad for p in policy.parameters())
    out = save_adapter(policy, tmp_path / "again")
    assert (out / "adapter_model.safetensors").is_file()


def test_collate_checks_lengths(tokenizer):
    with pytest.raises(ValueError, match="logprobs"):
        collate([Sample([1, 2], [3], logprobs=[-1.0, -2.0])], 0)
    with pytest.raises(ValueError, match="non-empty"):
        collate([Sample([1, 2], [])], 0)
    batch = collate([Sample([5, 6], [7, 8], advantage=[0.5, -1.0]), Sample([5], [9])], 0)
    assert batch.response_mask.tolist() == [[0, 1, 1], [1, 0, 0]]
    assert batch.advantages.tolist() == [[0, 0.5, -1.0], [0, 0, 0]]
    assert batch.targets.tolist() == [[6, 7, 8], [9, 0, 0]]


def test_micro_batches_keep_rows_times_longest_within_the_budget():
    lengths = [5, 9, 3, 9, 4, 20]
    parts = micro_batches(lengths, 18)
    assert sorted(i for p in parts for i in p) == list(range(6))
    assert parts[0] == [5]  # longer than the budget: alone
    for p in parts[1:]:
        assert len(p) * max(lengths[i] for i in p) <= 18
    assert micro_batches(lengths, 10_000) == [[5, 1, 3, 0, 4, 2]]
    assert micro_batches(lengths, 1) == [[5], [1], [3], [0], [4], [2]]
    # a micro-batch's rows, cut to their longest sequence
    batch = collate([Sample([5, 6], [7, 8]), Sample([5], [9]), Sample([1, 2, 3], [4])], 0)
    index, sub = batch.rows([1])
    assert index.tolist() == [1] and sub.input_ids.tolist() == [[5, 9]] and sub.targets.tolist() == [[9]]
    index, sub = batch.rows([2, 0])
    assert sub.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]] and sub.response_mask.tolist() == [[0, 0, 1], [0, 1, 1]]


def test_a_gradient_that_is_not_finite_does_not_step():
    # e.g. a reward of 1e300: one step would write NaN into the weights and the optimizer's moments
    import torch

    from reef_train.optim import optimizer_step

    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([w], lr=0.1)
    norm = optimizer_step([w], opt, (w * torch.tensor([1e38, 1e38, 1e38])).sum() * 1e10, max_grad_norm=1.0)
    assert not math.isfinite(norm)
    assert torch.equal(w.detach(), torch.ones(3)) and w.grad is None and not opt.state
    optimizer_step([w], opt, w.sum(), max_grad_norm=1.0)
    assert torch.isfinite(w).all() and not torch.equal(w.detach(), torch.ones(3))
