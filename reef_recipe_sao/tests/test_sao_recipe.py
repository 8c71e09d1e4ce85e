"""The recipe on hand-made batches of real rollouts from a tiny model: what trains, warm-up,
the critic schedule, staleness, learner state carried by the release, the contract kit."""

from __future__ import annotations

import shutil
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from reef_core import Batch, content_hash
from reef_core.testing import check_recipe
from reef_recipe_sao import SAORecipe
from reef_recipe_sao.testing import SCENARIO, context, experience, record, release_of, sampled_batch
from reef_train import Learner, read_learner_state
from reef_train.testing import prompt_ids

WORDS = ["one", "two", "three", "four"]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [prompt_ids(tokenizer, w) for w in WORDS]


@pytest.fixture(scope="module")
def digits(tokenizer):
    return set(tokenizer.convert_tokens_to_ids(list("0123456789")))


@pytest.fixture(scope="module")
def batch(tiny_model_dir, prompts):
    # rewards that vary, so critic and actor get gradients
    return sampled_batch(tiny_model_dir, prompts, lambda r: float(r[0] % 2), seed=3)


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def _learner(tiny_model_dir, **options) -> Learner:
    recipe = SAORecipe(**options)
    return Learner(recipe.algorithm, recipe.lora, SimpleNamespace(path=tiny_model_dir, device="cpu"), pad_id=0)


def counters(learner_dir) -> dict[str, int]:
    return read_learner_state(learner_dir, "sao").counters


def test_the_contract_kit_passes(tmp_path, trainable_runtime, batch):
    # the kit's synthetic batch has no token ids: nothing to train on, and no runtime needed
    assert check_recipe(SAORecipe(), tmp_path / "synthetic") == (None, None)
    # the kit serves the first candidate as a release, so the records (served before it) are one behind
    recipe = SAORecipe(batch_size=4, num_critic_only_steps=0, state_dir=tmp_path / "state")
    first, second = check_recipe(recipe, tmp_path / "real", batch=batch,
                                 context=lambda scratch, current: context(scratch, current, trainable_runtime))
    assert (first.artifact_dir / "adapter" / "adapter_config.json").is_file()
    assert counters(first.artifact_dir / "learner")["steps"] == 1
    # the kit served the first candidate: the lineage recognises its own snapshot and goes on
    assert second.metadata["sao"]["learner_from"] == "lineage step 1"
    assert counters(second.artifact_dir / "learner")["steps"] == 2
    assert recipe.lineages.head(SCENARIO).published_release == "rel_kit_1"


def test_declares_scored_single_reference_filters_and_counts_staleness_in_lineage_steps():
    # staleness is the lineage's (steps behind its head), not the release chain's: no freshness filter
    assert SAORecipe(max_staleness=3).filters == ["scored", "single_reference"]
    assert SAORecipe().max_staleness == 64


def test_lora_options_are_checked_by_reef_train_with_the_recipes_names():
    with pytest.raises(ValueError, match=r"critic_lr must be above 0.*lora_rank must be an integer of 1 or more, not 0"):
        SAORecipe(critic_lr=0, lora_rank=0)
    assert SAORecipe(lr=0.05, lora_lm_head=True).lora.lr == 0.05


def test_multi_reference_and_unusable_reports_are_not_trained_on(tmp_path, trainable_runtime, batch):
    exp = list(batch)
    two_refs = experience(90, 1.0, exp[0].records[0], exp[1].records[0])
    no_tokens = experience(91, 1.0, record(91, [5, 6], [7], None))
    unscored = experience(92, None, exp[2].records[0])
    recipe = SAORecipe(num_critic_only_steps=0, state_dir=tmp_path / "state")
    only_bad = Batch(SCENARIO, [two_refs, no_tokens, unscored])
    # nothing usable: None before the runtime is even asked (EchoRuntime could not train)
    assert recipe.propose(only_bad, None, context(tmp_path, None, None, "s0")) is None
    cand = recipe.propose(Batch(SCENARIO, [two_refs, *exp, no_tokens, unscored]), None,
                          context(tmp_path, None, trainable_runtime, "s1"))
    m = cand.metadata["sao"]["metrics"]
    assert m["rollouts_used"] == len(exp)
    assert (m["rollouts_dropped_multi_reference"], m["rollouts_dropped_no_tokens"], m["rollouts_dropped_unscored"]) == \
        (1, 1, 1)
    assert m["rollouts_dropped"] == 3


def test_records_with_ids_outside_the_vocabulary_or_broken_logprobs_are_skipped_not_fatal(tmp_path, trainable_runtime,
                                                                                         batch):
    # token ids recorded from another model (the scenario's model changed) or a runtime's broken
    # logprobs: each such report is dropped with a reason, the others train; none fails the step
    exp = list(batch)
    r = exp[0].records[0]
    p, resp, lp = list(r.prompt_token_ids), list(r.response_token_ids), list(r.logprobs)
    bad = [experience(80, 1.0, record(80, p, [10**6, *resp[1:]], lp)),
           experience(81, 1.0, record(81, [-3, *p[1:]], resp, lp)),
           experience(82, 1.0, record(82, p, resp, [None, *lp[1:]])),
           experience(83, 1.0, record(83, p, resp, [float("nan"), *lp[1:]]))]
    recipe = SAORecipe(num_critic_only_steps=0, state_dir=tmp_path / "state")
    assert recipe.propose(Batch(SCENARIO, bad[:1]), None, context(tmp_path, None, trainable_runtime, "s0")) is None
    cand = recipe.propose(Batch(SCENARIO, [*bad, *exp]), None, context(tmp_path, None, trainable_runtime, "s1"))
    m = cand.metadata["sao"]["metrics"]
    assert (m["rollouts_used"], m["rollouts_dropped_bad_tokens"]) == (len(exp), 4)


def test_a_huge_score_does_not_write_nan_into_the_lineages_critic(tmp_path, trainable_runtime, batch):
    # a finite but huge reward overflows the critic's loss; a warm-up step must not save NaN weights
    exp = list(batch)
    r = exp[0].records[0]
    huge = experience(70, 1e300, record(70, r.prompt_token_ids, r.response_token_ids, r.logprobs))
    recipe = SAORecipe(state_dir=tmp_path / "state")
    assert recipe.propose(Batch(SCENARIO, [huge, *exp[1:]]), None, context(tmp_path, None, trainable_runtime)) is None
    saved = list((tmp_path / "state").rglob("*.safetensors"))
    assert saved and all(torch.isfinite(t).all() for f in saved for t in load_file(str(f)).values())


def _lineage_at(recipe, tmp_path, steps: int, releases: dict[str, int]):
    """Give ``recipe``'s lineage a head ``steps`` steps in, having seen ``releases`` serve at
    the lineage steps given (what publishes and resets leave behind)."""
    import json

    lineages = recipe.lineages
    ckpt = tmp_path / "ckpt"
    (ckpt / "adapter").mkdir(parents=True, exist_ok=True)
    head = lineages.advance(SCENARIO, ckpt, {"serving": "rel3"}, expected=None, steps=steps)
    path = lineages.dir_of(SCENARIO) / "HEAD.json"
    data = json.loads(path.read_text())
    data["releases"] = releases
    path.write_text(json.dumps(data))
    return lineages.head(SCENARIO), head


def test_stale_rollouts_are_dropped_counted_and_their_lag_recorded(tmp_path, batch):
    """A rollout sampled more than ``max_staleness`` lineage steps behind the head is dropped
    (counted); the others carry their policy lag in lineage steps."""
    exp = list(batch)
    served = [experience(i, e.score, record(i, e.records[0].prompt_token_ids, e.records[0].response_token_ids,
                                            e.records[0].logprobs, release_id=rel))
              for i, (e, rel) in enumerate(zip(exp, ["rel3", "rel2", "rel1", None]))]
    recipe = SAORecipe(max_staleness=4, state_dir=tmp_path / "state")
    head, _ = _lineage_at(recipe, tmp_path, 10, {"": 0, "rel1": 2, "rel2": 6, "rel3": 9})
    rollouts, dropped = recipe.rollouts(Batch(SCENARIO, served), head)
    # rel3 serves step 9 (lag 1), rel2 step 6 (lag 4), rel1 step 2 (lag 8), the base step 0 (lag 10)
    assert [r.lag for r in rollouts] == [1, 4] and dropped["stale"] == 2
    assert [r.release_id for r in rollouts] == ["rel3", "rel2"]
    rollouts, dropped = SAORecipe(max_staleness=10).rollouts(Batch(SCENARIO, served), head)
    assert [r.lag for r in rollouts] == [1, 4, 8, 10] and dropped["stale"] == 0


def test_a_batch_of_stale_rollouts_is_skipped_and_counted(tmp_path, trainable_runtime, batch):
    exp = list(batch)
    old = [experience(i, e.score, record(i, e.records[0].prompt_token_ids, e.records[0].response_token_ids,
                                         e.records[0].logprobs, release_id="rel1")) for i, e in enumerate(exp)]
    recipe = SAORecipe(max_staleness=2, num_critic_only_steps=0, state_dir=tmp_path / "state")
    _lineage_at(recipe, tmp_path, 5, {"rel1": 1, "rel3": 5})
    current = replace(release_of(tmp_path / "serving", "rel3"))
    (tmp_path / "serving").mkdir()
    ctx = context(tmp_path, current, trainable_runtime)
    assert recipe.propose(Batch(SCENARIO, old), current, ctx) is None
    assert (ctx.skip_kind, ctx.skip_counts) == ("stale", {"rollouts_stale": len(exp)})
    assert "stale=4" in ctx.skip_reason
    assert recipe.lineages.head(SCENARIO).step == 5                  # the lineage did not move


def test_a_lineage_that_ran_max_staleness_ahead_of_serving_resets_to_it(tmp_path, trainable_runtime, batch):
    """What serves is more than ``max_staleness`` steps behind the head (no publish for that
    long): all its traffic would be stale, so the lineage resets to the serving release's state
    and trains the batch from there (lag 0), the reason in the candidate's metadata."""
    exp = list(batch)
    fresh = [experience(i, e.score, record(i, e.records[0].prompt_token_ids, e.records[0].response_token_ids,
                                           e.records[0].logprobs, release_id="rel3")) for i, e in enumerate(exp)]
    recipe = SAORecipe(max_staleness=2, num_critic_only_steps=0, state_dir=tmp_path / "state")
    _lineage_at(recipe, tmp_path, 6, {"rel3": 3})
    current = release_of(tmp_path / "serving", "rel3")
    (tmp_path / "serving").mkdir()
    # the head says rel3 served when it was written: continued, then found 3 steps ahead of it
    cand = recipe.propose(Batch(SCENARIO, fresh), current, context(tmp_path, current, trainable_runtime))
    assert cand is not None
    lin = cand.metadata["lineage"]
    assert "ran 3 steps ahead of the serving release (rel3)" in lin["reset"] and "max_staleness 2" in lin["reset"]
    assert (lin["rollouts_stale"], lin["lag_max"]) == (0, 0)
    assert cand.metadata["sao"]["learner_from"] == "new"                # serving's state: no learner there
    head = recipe.lineages.head(SCENARIO)
    assert head.step == 7 and "max_staleness" in head.last_reset["reason"]


def test_warm_up_keeps_the_policy_bit_identical_then_the_actor_moves(tiny_model_dir, batch):
    learner = _learner(tiny_model_dir, num_critic_only_steps=2)
    rollouts, _ = SAORecipe().rollouts(batch, None)
    before = _params(learner.policy)
    head_before = learner.critic.head.weight.detach().clone()
    for _ in range(2):
        assert learner.algorithm.warming_up(learner)
        assert learner.step(rollouts)["actor_updated"] is False
    after = _params(learner.policy)
    assert all(torch.equal(before[n], after[n]) for n in before)          # bit-identical
    assert not torch.equal(head_before, learner.critic.head.weight)        # the critic did learn
    assert learner.step(rollouts)["actor_updated"] is True
    assert any(not torch.equal(after[n], p) for n, p in _params(learner.policy).items())


def test_a_saved_learner_resumes_exactly(tiny_model_dir, batch, tmp_path):
    """Two SAO steps (a warm-up and an actor step), saved and loaded, then a third: the same
    policy, critic, value head, moments and counters as three steps without the interruption."""
    rollouts, _ = SAORecipe().rollouts(batch, None)
    options = {"num_critic_only_steps": 1, "lr": 0.05, "lora_rank": 4, "lora_alpha": 8, "lora_lm_head": True}
    uninterrupted = _learner(tiny_model_dir, **options)
    for _ in range(3):
        last = uninterrupted.step(rollouts)
    first = _learner(tiny_model_dir, **options)
    first.step(rollouts)
    first.step(rollouts)
    ck = first.save(tmp_path / "ck")
    recipe = SAORecipe(**options)
    resumed = Learner(recipe.algorithm, recipe.lora, SimpleNamespace(path=tiny_model_dir, device="cpu"),
                      adapter=ck / "adapter", state=ck / "learner", pad_id=0)
    again = resumed.step(rollouts)
    assert resumed.counters == uninterrupted.counters == {"steps": 3, "actor_steps": 2, "critic_steps": 6,
                                                          "rollouts_used": 3 * len(rollouts)}
    for key in ("actor_loss", "actor_grad_norm", "critic_loss", "critic_grad_norm", "ratio_mean"):
        assert again[key] == pytest.approx(last[key], rel=1e-5, abs=1e-7), key
    pairs = [(uninterrupted.policy, resumed.policy), (uninterrupted.critic, resumed.critic)]
    for a, b in pairs:
        for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
            if p.requires_grad:
                torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7, msg=name)
    for a, b in ((uninterrupted.optimizer, resumed.optimizer), (uninterrupted.critic_optimizer, resumed.critic_optimizer)):
        for p, q in zip((p for g in a.param_groups for p in g["params"]), (q for g in b.param_groups for q in g["params"])):
            torch.testing.assert_close(b.state[q]["exp_avg_sq"], a.state[p]["exp_avg_sq"], rtol=1e-5, atol=1e-9)
            assert float(b.state[q]["step"]) == float(a.state[p]["step"])


def test_k_critic_updates_before_each_actor_update(tiny_model_dir, batch):
    learner = _learner(tiny_model_dir, num_critic_only_steps=1, critic_steps_per_actor=3)
    rollouts, _ = SAORecipe().rollouts(batch, None)
    calls = []
    for name, opt in (("critic", learner.critic_optimizer), ("actor", learner.optimizer)):
        original = opt.step
        opt.step = lambda *a, _n=name, _o=original, **k: (calls.append(_n), _o(*a, **k))[1]
    learner.step(rollouts)                                   # warm-up: critic only
    learner.step(rollouts)
    learner.step(rollouts)
    assert calls == ["critic"] * 3 + (["critic"] * 3 + ["actor"]) * 2
    assert (learner.counters["critic_steps"], learner.counters["actor_steps"], learner.counters["steps"]) == (9, 2, 3)


def test_warm_up_happens_once_per_lineage(tmp_path, trainable_runtime, batch):
    recipe = SAORecipe(batch_size=4, num_critic_only_steps=1, state_dir=tmp_path / "state")
    assert recipe.propose(batch, None, context(tmp_path, None, trainable_runtime, "s1")) is None   # critic only
    head = recipe.lineages.head(SCENARIO)
    assert head.step == 1 and counters(head.checkpoint / "learner")["steps"] == 1
    cand = recipe.propose(batch, None, context(tmp_path, None, trainable_runtime, "s2"))
    assert cand.metadata["sao"]["learner_from"] == "lineage step 1"
    assert cand.metadata["sao"]["steps"] == 2 and cand.metadata["sao"]["actor_steps"] == 1
    # not published: the next candidate still starts from the lineage, never warms up again
    again = recipe.propose(batch, None, context(tmp_path, None, trainable_runtime, "s3"))
    assert again.metadata["sao"]["learner_from"] == "lineage step 2"
    assert (again.metadata["sao"]["steps"], again.metadata["sao"]["actor_steps"]) == (3, 2)
    assert again.metadata["lineage"]["step"] == 3


def _adapter(artifact) -> dict[str, torch.Tensor]:
    return load_file(str(next((artifact / "adapter").glob("*.safetensors"))))


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return sum(float((a[k].float() - b[k].float()).norm()) for k in a)


def test_a_rejected_candidates_training_continues_on_the_lineage(tmp_path, trainable_runtime, batch):
    recipe = SAORecipe(batch_size=4, num_critic_only_steps=0, lr=0.01, state_dir=tmp_path / "state")
    first = recipe.propose(batch, None, context(tmp_path, None, trainable_runtime, "s1"))
    shutil.copytree(first.artifact_dir, tmp_path / "rel1")
    # the first candidate was published
    serving = replace(release_of(tmp_path / "rel1", "rel1"), content_hash=content_hash(tmp_path / "rel1"))
    # the same batch, retried twice against the same serving release, both rejected
    second = recipe.propose(batch, serving, context(tmp_path, serving, trainable_runtime, "s2"))
    third = recipe.propose(batch, serving, context(tmp_path, serving, trainable_runtime, "s3"))
    assert (second.metadata["sao"]["learner_from"], third.metadata["sao"]["learner_from"]) == \
        ("lineage step 1", "lineage step 2")
    assert content_hash(second.artifact_dir) != content_hash(third.artifact_dir)   # never the same artifact twice
    served, a2, a3 = _adapter(tmp_path / "rel1"), _adapter(second.artifact_dir), _adapter(third.artifact_dir)
    assert _distance(a3, served) > _distance(a2, served) > 0     # two steps away from serving, not one
    assert counters(third.artifact_dir / "learner")["steps"] == 3
    assert third.metadata["lineage"]["steps_since_publish"] == 2
    # off-policy: the rollouts came from the base model, which the lineage left 1, then 2 steps ago
    lags = [c.metadata["sao"]["metrics"]["lineage_lag_max"] for c in (first, second, third)]
    assert lags == [0, 1, 2]


def test_a_restart_continues_the_lineage(tmp_path, trainable_runtime, batch):
    first = SAORecipe(batch_size=4, num_critic_only_steps=0, state_dir=tmp_path / "state").propose(
        batch, None, context(tmp_path, None, trainable_runtime, "s1"))
    # a new process on the same state directory: a new recipe object
    again = SAORecipe(batch_size=4, num_critic_only_steps=0, state_dir=tmp_path / "state").propose(
        batch, None, context(tmp_path, None, trainable_runtime, "s2"))
    assert again.metadata["sao"]["learner_from"] == "lineage step 1"
    assert counters(again.artifact_dir / "learner")["steps"] == counters(first.artifact_dir / "learner")["steps"] + 1


def test_serving_that_moved_elsewhere_resets_the_lineage(tmp_path, trainable_runtime, batch):
    recipe = SAORecipe(batch_size=4, num_critic_only_steps=0, state_dir=tmp_path / "state")
    recipe.propose(batch, None, context(tmp_path, None, trainable_runtime, "s1"))
    recipe.propose(batch, None, context(tmp_path, None, trainable_runtime, "s2"))
    # another server published something else (or a rollback did): the lineage restarts from it
    other = SAORecipe(batch_size=4, num_critic_only_steps=0, state_dir=tmp_path / "other").propose(
        batch, None, context(tmp_path, None, trainable_runtime, "o1"))
    shutil.copytree(other.artifact_dir, tmp_path / "relX")
    serving = replace(release_of(tmp_path / "relX", "relX"), content_hash=content_hash(tmp_path / "relX"))
    cand = recipe.propose(batch, serving, context(tmp_path, serving, trainable_runtime, "s3"))
    assert cand.metadata["sao"]["learner_from"] == "the serving release"
    head = recipe.lineages.head(SCENARIO)
    assert head.last_reset["to_release"] == "relX" and "serving moved" in head.last_reset["reason"]
    assert counters(cand.artifact_dir / "learner")["steps"] == 2    # relX's one step, then this one


def test_a_batch_with_nothing_to_learn_advances_nothing(tmp_path, trainable_runtime, tiny_model_dir, prompts):
    # no reward anywhere: the actor's gradient is zero (SAO: a fresh critic; grpo_dis: equal groups)
    unrewarded = sampled_batch(tiny_model_dir, prompts, lambda r: 0.0, seed=3)
    grouped = sampled_batch(tiny_model_dir, prompts[:2], lambda r: 0.0, seed=4, num_samples=2)
    for recipe, b in ((SAORecipe(batch_size=4, num_critic_only_steps=0, state_dir=tmp_path / "sao"), unrewarded),
                      (SAORecipe(mode="grpo_dis", n_samples_per_prompt=2, batch_size=4, state_dir=tmp_path / "grpo"),
                       grouped)):
        ctx = context(tmp_path, None, trainable_runtime, recipe.mode)
        assert recipe.propose(b, None, ctx) is None
        assert recipe.lineages.head(SCENARIO) is None
        assert "the actor's gradient is 0" in ctx.skip_reason    # the skipped candidate says why


def test_the_summary_reports_the_reward_of_every_step(tmp_path, trainable_runtime, tiny_model_dir, prompts):
    rewarded = list(sampled_batch(tiny_model_dir, prompts, lambda r: 1.0, seed=3))
    unrewarded = list(sampled_batch(tiny_model_dir, prompts, lambda r: 0.0, seed=4))
    recipe = SAORecipe(batch_size=4, steps_per_candidate=2, num_critic_only_steps=0, state_dir=tmp_path / "state")
    cand = recipe.propose(Batch(SCENARIO, rewarded + unrewarded), None, context(tmp_path, None, trainable_runtime))
    assert [s["reward_mean"] for s in cand.metadata["sao"]["metrics"]["steps_detail"]] == [1.0, 0.0]
    assert cand.metadata["sao"]["metrics"]["reward_mean"] == 0.5
    assert "reward 0.500" in cand.summary


def test_a_restart_without_a_lineage_resumes_the_critic_from_the_serving_release(tmp_path, trainable_runtime, batch):
    first = SAORecipe(batch_size=4, num_critic_only_steps=0, state_dir=tmp_path / "state-a").propose(
        batch, None, context(tmp_path, None, trainable_runtime, "s1"))
    shutil.copytree(first.artifact_dir, tmp_path / "rel1")
    current = release_of(tmp_path / "rel1", "rel1")
    saved_head = load_file(str(tmp_path / "rel1" / "learner" / "value_head.safetensors"))

    # a new process: a new recipe object and another state directory; the release is all it has
    recipe = SAORecipe(batch_size=4, num_critic_only_steps=0, state_dir=tmp_path / "state-b")
    adapter, learner_dir, source = recipe.learner_source(None, current, trainable_runtime)
    assert (learner_dir, source) == (tmp_path / "rel1" / "learner", "the serving release")
    base = trainable_runtime.base_model()
    learner = Learner(recipe.algorithm, recipe.lora, base, adapter=adapter, state=learner_dir, pad_id=0)
    assert torch.equal(learner.critic.head.weight.detach(), saved_head["weight"])
    assert learner.counters["steps"] == 1 and learner.optimizer.state    # moments restored, not re-warmed
    second = recipe.propose(batch, current, context(tmp_path, current, trainable_runtime, "s2"))
    assert second.metadata["sao"]["learner_from"] == "the serving release"
    assert counters(second.artifact_dir / "learner")["critic_steps"] == 4


def test_several_optimizer_steps_make_one_candidate(tmp_path, trainable_runtime, batch):
    recipe = SAORecipe(batch_size=2, steps_per_candidate=2, num_critic_only_steps=1, state_dir=tmp_path / "state")
    assert recipe.batch_size == 4  # what the kernel hands propose: every step of the candidate
    cand = recipe.propose(Batch(SCENARIO, list(batch)[:4]), None, context(tmp_path, None, trainable_runtime))
    m = cand.metadata["sao"]
    # the first step warms the critic up, the second moves the policy: one candidate carries both
    assert m["metrics"]["optimizer_steps"] == 2 and m["metrics"]["rollouts_used"] == 4
    assert (m["steps"], m["actor_steps"]) == (2, 1)
    assert [s["actor_updated"] for s in m["metrics"]["steps_detail"]] == [False, True]
    # the summary reports every optimizer step's reward, not only the last one's
    per_step = [f"{s['reward_mean']:.3f}" for s in m["metrics"]["steps_detail"]]
    assert f"(by step: {per_step[0]} warm-up, {per_step[1]})" in cand.summary


def test_a_backlog_of_batches_makes_one_optimizer_step_each(tmp_path, trainable_runtime, batch):
    """``max_batches``: the kernel hands over the batches that waited (here 2 of 2 rollouts); each
    is an optimizer step of the one candidate, and the lineage moves by both."""
    recipe = SAORecipe(batch_size=2, max_batches=2, num_critic_only_steps=0, state_dir=tmp_path / "state")
    assert (recipe.batch_size, recipe.max_batches, SAORecipe().max_batches) == (2, 2, 1)
    cand = recipe.propose(Batch(SCENARIO, list(batch)[:4]), None, context(tmp_path, None, trainable_runtime))
    m = cand.metadata["sao"]
    assert m["metrics"]["optimizer_steps"] == 2 and m["metrics"]["rollouts_used"] == 4 and m["steps"] == 2
    assert cand.metadata["lineage"]["step"] == 2
    with pytest.raises(ValueError, match="max_batches"):
        SAORecipe(max_batches=0)


def test_grpo_dis_uses_groups_of_one_prompt_and_no_critic(tmp_path, trainable_runtime, tiny_model_dir, prompts):
    grouped = sampled_batch(tiny_model_dir, prompts[:2], lambda r: float(r[0] % 2), seed=5, num_samples=4)
    single = sampled_batch(tiny_model_dir, prompts[3:], lambda r: 1.0, seed=6)
    items = list(grouped) + [experience(50, 1.0, single.items[0].records[0])]
    recipe = SAORecipe(mode="grpo_dis", n_samples_per_prompt=4, batch_size=8, state_dir=tmp_path / "state")
    cand = recipe.propose(Batch(SCENARIO, items), None, context(tmp_path, None, trainable_runtime))
    m = cand.metadata["sao"]["metrics"]
    assert (m["rollouts_used"], m["rollouts_dropped_ungrouped"]) == (8, 1)
    assert "critic_updates" not in m and m["actor_updated"] is True
    assert not (cand.artifact_dir / "learner" / "critic").exists()
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        SAORecipe(mode="grpo_dis")


@pytest.mark.parametrize("bound", ["1e-9", "null", "default"])
def test_the_lineage_resets_when_its_kl_to_serving_passes_the_bound(tmp_path, trainable_runtime, batch, bound):
    """The divergence guard on ``loop.lineage_max_kl``: the step measures its new head's KL to
    serving (the base here) on the batch's rollouts with reef-train's logprob function; past the
    bound the lineage resets to serving, the reason in the candidate's metadata."""
    from reef_core.testing import recipe_context, reef_settings

    overrides = [] if bound == "default" else [f"loop.lineage_max_kl={bound}"]
    settings = reef_settings(tmp_path / "settings", overrides)
    recipe = SAORecipe(batch_size=4, num_critic_only_steps=0, lr=0.01, state_dir=tmp_path / "state")
    ctx = recipe_context(tmp_path / "s1", None, recipe="sao", runtime=trainable_runtime, settings=settings)
    cand = recipe.propose(batch, None, ctx)
    kl = cand.metadata["sao"]["metrics"].get("lineage_kl")
    head = recipe.lineages.head(SCENARIO)
    if bound == "null":                     # no bound: not even measured
        assert kl is None and "reset" not in cand.metadata["lineage"] and head.checkpoint is not None
    elif bound == "default":                # one small step stays far inside the default bound (1.0)
        assert 0 < kl < 0.1 and "reset" not in cand.metadata["lineage"] and head.checkpoint is not None
    else:
        assert kl > 1e-9
        reason = cand.metadata["lineage"]["reset"]
        assert "KL to the serving release (the base model)" in reason and "above loop.lineage_max_kl 1e-09" in reason
        assert head.checkpoint is None and head.last_reset["reason"] == reason and head.step == 1
        # the next step starts again from what serves
        again = recipe.propose(batch, None, recipe_context(tmp_path / "s2", None, recipe="sao",
                                                           runtime=trainable_runtime, settings=settings))
        assert again.metadata["sao"]["learner_from"] == "new"
