"""The grid barrier, mixed-release rejection, constant groups, the recipe's step and the contract kit."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from reef_core import Batch
from reef_core.testing import check_recipe, recipe_context
from reef_recipe_tttd import GridFilter, Rollout, TTTDRecipe, barrier, informative_groups
from reef_recipe_tttd.grid import GridError
from reef_recipe_tttd.loss import importance_sampling_loss
from reef_recipe_tttd.testing import SCENARIO, sampled_grid, scored_grid
from reef_train import Learner, read_learner_state
from reef_train.testing import prompt_ids


def test_barrier_needs_every_coordinate_of_one_release():
    grid = barrier(scored_grid([[0.1, 0.2], [0.3, 0.4]]), 2, 2)
    assert grid.complete and grid.group_rewards() == [[0.1, 0.2], [0.3, 0.4]]
    with pytest.raises(GridError, match="3 of 4"):
        barrier(scored_grid([[0.1, 0.2], [0.3, 0.4]])[:3], 2, 2)
    with pytest.raises(GridError, match="mixes releases"):
        barrier(scored_grid([[0.1, 0.2], [0.3, 0.4]], releases=[["r1", "r1"], ["r1", "r2"]]), 2, 2)
    with pytest.raises(GridError, match="exactly one grid"):
        barrier(scored_grid([[0.1, 0.2]], step=0) + scored_grid([[0.3, 0.4]], step=1), 1, 2)


def test_the_filter_releases_only_whole_single_release_grids_oldest_first():
    flt = GridFilter(groups_per_step=1, rollouts_per_group=2)
    step0 = scored_grid([[0.1, 0.2]], step=0)
    step1 = scored_grid([[0.3, 0.4]], step=1)
    mixed = scored_grid([[0.5, 0.6]], step=2, releases=[["r1", "r2"]])
    half = scored_grid([[0.7, 0.8]], step=3)[:1]
    items = step1 + step0 + mixed + half + [step0[0]]  # a retried coordinate of step 0
    kept = flt.apply(items, None)
    assert [e.report_id for e in kept] == [e.report_id for e in step1 + step0]
    assert flt.apply(kept, None) == kept  # idempotent
    # another shape, malformed metadata: left out
    wrong = scored_grid([[0.1, 0.2, 0.3]])
    assert flt.apply(wrong, None) == []
    bad = [e.__class__(**{**e.__dict__, "metadata": {**e.metadata, "comparison_set": "x"}}) for e in step0]
    assert flt.apply(bad, None) == []


def test_constant_groups_are_removed_and_one_kept_when_all_are():
    assert informative_groups([[0.0, 0.0], [0.1, 0.5], [1.0, 1.0]]) == ([1], 2)
    assert informative_groups([[0.0, 0.0], [0.2, 0.2]]) == ([0], 1)


def test_mixed_release_batch_trains_nothing(tmp_path, trainable_runtime):
    recipe = TTTDRecipe(groups_per_step=2, rollouts_per_group=2)
    batch = Batch(SCENARIO, scored_grid([[0.1, 0.2], [0.3, 0.4]], releases=[["r1", "r1"], ["r2", "r2"]]))
    assert recipe.propose(batch, None, recipe_context(tmp_path, None, recipe="tttd", runtime=trainable_runtime)) is None


def test_loss_is_an_unclipped_token_sum():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0], [-1.0, -0.1]])
    adv = torch.tensor([[2.0, 2.0], [-1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = importance_sampling_loss(logp, old, adv, mask)
    expected = -(1.0 * 2.0 + torch.exp(torch.tensor(-1.0)) * 2.0 + torch.exp(torch.tensor(0.5)) * -1.0)
    assert loss.item() == pytest.approx(float(expected))
    assert stats["tokens"] == 3


@pytest.fixture(scope="module")
def grid_batch(tiny_model_dir, tokenizer):
    prompt = prompt_ids(tokenizer, "pack")
    # reward: how many digits the response holds (varies across rollouts)
    digits = set(tokenizer.convert_tokens_to_ids(list("0123456789")))
    return sampled_grid(tiny_model_dir, prompt, lambda r: float(sum(t in digits for t in r)) + 0.01 * len(r),
                        groups=2, rollouts=4, seed=1)


def test_one_step_moves_the_lora_towards_the_best(tiny_model_dir, grid_batch):
    base = SimpleNamespace(path=tiny_model_dir, device="cpu")
    recipe = TTTDRecipe(lr=5e-2, lora_rank=4, lora_alpha=8, lora_lm_head=True)
    learner = Learner(recipe.algorithm, recipe.lora, base, pad_id=0)
    exps = list(grid_batch)
    groups = [[Rollout(e.records[0].prompt_token_ids, e.records[0].response_token_ids, e.records[0].logprobs,
                       float(e.score)) for e in exps[g * 4:(g + 1) * 4]] for g in range(2)]
    before = {n: p.detach().clone() for n, p in learner.policy.named_parameters() if "lora_" in n}
    metrics = learner.step(groups)
    # the first step's ratios are 1: the recorded logprobs are this policy's
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["kl_sampled"] == pytest.approx(0.0, abs=1e-4)  # a fresh LoRA is the base
    assert metrics["beta_mean"] > 0 and metrics["trained_rollouts"] == 8
    assert any(not torch.equal(before[n], p) for n, p in learner.policy.named_parameters() if "lora_" in n)
    # the best rollout of each group got likelier
    from reef_train import Sample, collate, token_logprobs

    for group in groups:
        best = max(group, key=lambda r: r.reward)
        batch = collate([Sample(best.prompt_ids, best.response_ids)], 0)
        with torch.no_grad():
            now = token_logprobs(learner.policy, batch, 1.0)
        start = len(best.prompt_ids) - 1
        assert float(now[0, start:start + len(best.response_ids)].sum()) > sum(best.logprobs)


def test_the_contract_kit_passes(tmp_path, trainable_runtime, grid_batch):
    # the kit's synthetic batch is no grid: rejected, nothing trains
    assert check_recipe(TTTDRecipe(), tmp_path / "synthetic") == (None, None)
    recipe = TTTDRecipe(groups_per_step=2, rollouts_per_group=4, max_staleness=1, lora_rank=4, lora_alpha=8,
                        lora_lm_head=True, lr=1e-3)
    first, second = check_recipe(recipe, tmp_path / "real", batch=grid_batch,
                                 context=lambda scratch, current: recipe_context(scratch, current, recipe="tttd",
                                                                                 runtime=trainable_runtime))
    assert (first.artifact_dir / "adapter" / "adapter_config.json").is_file()
    assert read_learner_state(first.artifact_dir / "learner", "tttd").counters["steps"] == 1
    # the kit served the first candidate: the lineage recognises its own snapshot and goes on
    assert second.metadata["tttd"]["learner_from"] == "lineage step 1"
    assert read_learner_state(second.artifact_dir / "learner", "tttd").counters["steps"] == 2
    m = first.metadata["tttd"]["metrics"]
    for key in ("reward_min", "reward_max", "reward_mean", "reward_std", "reward_zero_fraction", "constant_groups",
                "constant_groups_removed", "grid_size", "training_size", "beta_mean", "kl_sampled"):
        assert key in m, key
    assert m["grid_size"] == 8


def test_search_only_trains_nothing(tmp_path, grid_batch):
    recipe = TTTDRecipe(variant="search-only", groups_per_step=2, rollouts_per_group=4)
    # no trainable runtime needed
    assert recipe.propose(grid_batch, None, recipe_context(tmp_path, None, recipe="tttd")) is None


def test_records_without_tokens_say_what_to_do(tmp_path, trainable_runtime):
    recipe = TTTDRecipe(groups_per_step=1, rollouts_per_group=2)
    batch = Batch(SCENARIO, scored_grid([[0.1, 0.9]]))
    with pytest.raises(GridError, match="runtime=local"):
        recipe.propose(batch, None, recipe_context(tmp_path, None, recipe="tttd", runtime=trainable_runtime))


@pytest.mark.parametrize("tokens, why", [
    (([1, 2], [3, 4], [-0.1, None]), "malformed"),  # a third-party runtime's logprob
    (([1, -2], [3, 4], [-0.1, -0.2]), "malformed"),
    (([1, 2], [3, 10**6], [-0.1, -0.2]), "outside the base model's vocabulary"),  # another model's ids
])
def test_a_grid_with_unusable_tokens_is_skipped_not_raised(tmp_path, trainable_runtime, tokens, why):
    """Raised, the step handed the same batch back at every next step, for good."""
    recipe = TTTDRecipe(groups_per_step=1, rollouts_per_group=2)
    good = ([1, 2], [3, 4], [-0.1, -0.2])
    batch = Batch(SCENARIO, scored_grid([[0.1, 0.9]], tokens=[[good, tokens]]))
    ctx = recipe_context(tmp_path, None, recipe="tttd", runtime=trainable_runtime)
    assert recipe.propose(batch, None, ctx) is None
    assert why in ctx.skip_reason


def test_options_are_checked():
    with pytest.raises(ValueError, match="variant"):
        TTTDRecipe(variant="ppo")
    with pytest.raises(ValueError, match="rollouts_per_group"):
        TTTDRecipe(rollouts_per_group=1)
    with pytest.raises(ValueError, match=r"beta1 must be a number in \[0, 1\), not 1.5"):
        TTTDRecipe(beta1=1.5)
    assert (TTTDRecipe().lora.optimizer, TTTDRecipe().lora.max_grad_norm) == ("adam", None)  # the reference's Adam
    r = TTTDRecipe(groups_per_step=3, rollouts_per_group=4)
    assert r.batch_size == 12 and r.default_evaluator == "always"
    assert ("tttd_grid", {"groups_per_step": 3, "rollouts_per_group": 4}) in r.filters


def test_a_rejected_grid_steps_training_continues_on_the_lineage(tmp_path, trainable_runtime, grid_batch):
    recipe = TTTDRecipe(groups_per_step=2, rollouts_per_group=4, max_staleness=1, lora_rank=4, lora_alpha=8, lr=1e-3,
                        state_dir=tmp_path / "state")
    ctx = lambda name: recipe_context(tmp_path / name, None, recipe="tttd", runtime=trainable_runtime)  # noqa: E731
    first = recipe.propose(grid_batch, None, ctx("s1"))
    second = recipe.propose(grid_batch, None, ctx("s2"))   # the first was rejected: serving never changed
    assert (first.metadata["tttd"]["learner_from"], second.metadata["tttd"]["learner_from"]) == \
        ("new", "lineage step 1")
    assert read_learner_state(second.artifact_dir / "learner", "tttd").counters["steps"] == 2
    assert second.metadata["lineage"]["step"] == 2
    # the grid was sampled by rel1, a release this lineage never saw serve (its lag counts from
    # the lineage's start): two steps in, with max_staleness 1, it is stale and trains nothing
    # (counted); each step recorded its lag
    assert [c.metadata["tttd"]["metrics"]["lineage_lag_max"] for c in (first, second)] == [0, 1]
    third = ctx("s3")
    assert recipe.propose(grid_batch, None, third) is None
    assert (third.skip_kind, third.skip_counts) == ("stale", {"rollouts_stale": len(list(grid_batch))})
    assert recipe.lineages.head(grid_batch.scenario).step == 2


def test_a_grid_without_reward_signal_proposes_no_candidate(tmp_path, trainable_runtime, grid_batch):
    """Every group's reward is constant and the policy is still the base: every advantage is 0
    and so is the KL term, so nothing trains (counted, with the reason) and the lineage does
    not move."""
    flat = Batch(grid_batch.scenario, [replace(e, score=1.0) for e in grid_batch])
    recipe = TTTDRecipe(groups_per_step=2, rollouts_per_group=4, lora_rank=4, lora_alpha=8, state_dir=tmp_path / "st")
    ctx = recipe_context(tmp_path / "s1", None, recipe="tttd", runtime=trainable_runtime)
    assert recipe.propose(flat, None, ctx) is None
    assert ctx.skip_kind == "nothing_to_learn" and "constant reward" in ctx.skip_reason
    assert "the policy is the base model" in ctx.skip_reason
    assert recipe.lineages.head(grid_batch.scenario) is None


def test_a_constant_grid_after_training_trains_the_kl_term_alone(tmp_path, trainable_runtime, grid_batch):
    """As the reference does, a grid whose every group is constant keeps one group: with the
    lineage away from the base, the step trains the KL term alone (a candidate that says so);
    with kl_coef 0 there is nothing to train."""
    flat = Batch(grid_batch.scenario, [replace(e, score=1.0) for e in grid_batch])
    for kl_coef, trains in ((0.1, True), (0.0, False)):
        recipe = TTTDRecipe(groups_per_step=2, rollouts_per_group=4, lora_rank=4, lora_alpha=8, lr=1e-2,
                            kl_coef=kl_coef, max_staleness=4, state_dir=tmp_path / f"st{kl_coef}")
        ctx = lambda name: recipe_context(tmp_path / name, None, recipe="tttd", runtime=trainable_runtime)  # noqa: E731
        assert recipe.propose(grid_batch, None, ctx(f"a{kl_coef}")).metadata["tttd"]["metrics"]["kl_only"] is False
        second = ctx(f"b{kl_coef}")
        cand = recipe.propose(flat, None, second)
        if not trains:
            assert cand is None and second.skip_kind == "nothing_to_learn" and "kl_coef is 0" in second.skip_reason
            assert recipe.lineages.head(grid_batch.scenario).step == 1
            continue
        m = cand.metadata["tttd"]["metrics"]
        assert m["kl_only"] is True and m["training_groups"] == 1 and m["constant_groups_removed"] == 1
        # the reward part (the LOO's 1e-12 guard aside); the KL part is per token
        assert (m["advantage_max"], m["advantage_min"]) == (pytest.approx(0.0, abs=1e-9),) * 2
        assert "the KL term alone trained" in cand.summary
        assert recipe.lineages.head(grid_batch.scenario).step == 2


def test_a_kl_only_step_pulls_a_moved_policy_back_towards_the_base(tiny_model_dir, grid_batch):
    """What the KL-only step does: with every advantage 0, the centred fold's per-token
    advantage −kl_coef·(diff_t − mean diff), diff_t = log π(t) − log p_base(t), is the gradient of
    −kl_coef/2·Σ(diff_t − mean)², so a policy that moved away from the base (a few steps of
    reward) comes back in line with it on the grid's tokens: that sum shrinks, and ends below
    where the same step without the KL term (Adam's momentum alone) leaves it."""
    import copy

    from reef_train import Sample, collate, reference_logprobs, token_logprobs

    base = SimpleNamespace(path=tiny_model_dir, device="cpu")
    recipe = TTTDRecipe(lr=1e-2, lora_rank=4, lora_alpha=8, lora_lm_head=True, kl_coef=1.0)
    learner = Learner(recipe.algorithm, recipe.lora, base, pad_id=0)
    exps = list(grid_batch)
    rows = [Rollout(e.records[0].prompt_token_ids, e.records[0].response_token_ids, e.records[0].logprobs,
                    float(e.score)) for e in exps]
    batch = collate([Sample(r.prompt_ids, r.response_ids) for r in rows], 0)
    ones = torch.ones(len(rows))

    def spread(of: Learner = learner) -> tuple[float, list[list[float]]]:
        """Σ(diff_t − mean diff)² over the rollouts' tokens, and π's logprobs of each rollout."""
        with torch.no_grad():
            now, ref = token_logprobs(of.policy, batch, ones), reference_logprobs(of.policy, batch, ones)
        mask = batch.response_mask > 0
        diff = (now - ref)[mask]
        logps = [[float(x) for x in now[i][mask[i]]] for i in range(len(rows))]
        return float(((diff - diff.mean()) ** 2).sum()), logps

    assert spread()[0] == pytest.approx(0.0, abs=1e-8)  # a fresh LoRA is the base
    for _ in range(3):
        learner.step([rows[:4], rows[4:]])
    before, logps = spread()
    assert before > 0.1  # the policy moved away from the base
    # the same rollouts as the moved policy samples them, every reward equal: only the KL term trains
    constant = [Rollout(r.prompt_ids, r.response_ids, lp, 1.0) for r, lp in zip(rows, logps)]
    twin = copy.deepcopy(learner)
    metrics = learner.step([constant])
    assert (metrics["advantage_max"], metrics["advantage_min"]) == (pytest.approx(0.0, abs=1e-9),) * 2
    replace(recipe.algorithm, kl_coef=0.0).step(twin, [constant])
    assert spread()[0] < before and spread()[0] < spread(twin)[0]  # momentum alone carried it further away
