"""The recipe on hand-made batches of judged turns recorded on a tiny model: the contract kit,
what trains and why not, the teachers, the candidate's metadata and the per-batch record."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from reef_core import Batch, Experience
from reef_core.testing import check_recipe, recipe_context
from reef_recipe_openclaw import OpenClawRecipe
from reef_recipe_openclaw.processor import METADATA_KEY
from reef_recipe_openclaw.teachers import HINT_PREFIX, teacher_prompt_ids, with_hint
from reef_recipe_openclaw.testing import SCENARIO, chat_record, token_capture
from reef_train import Learner, read_learner_state

HINT = "Answer in one short sentence."


def _turn(tokenizer, i, question, reply, *, score, meta=None, feedback=None, top=True):
    messages = [{"role": "user", "content": question}]
    capture = token_capture(tokenizer, messages, reply)
    if not top:
        capture.pop("top_logprobs")
    rec = chat_record(f"rec{i}", messages, reply, at=i, tokens=capture)
    metadata = {METADATA_KEY: meta} if meta is not None else {}
    return Experience(report_id=f"rep{i}", scenario=SCENARIO, score=score, feedback=feedback, metadata=metadata,
                      created_at=datetime.now(timezone.utc), records=(rec,))


def _judged(eval_score, hints, reward):
    return {"record_id": "x", "eval_votes": [eval_score] * 3, "eval_score": eval_score, "hint_votes": [1, 1, -1],
            "hints": hints, "dispatch": "?", "reward": reward, "next_state": {"role": "user", "text": "no, shorter"}}


@pytest.fixture(scope="module")
def batch(tokenizer):
    return Batch(SCENARIO, [
        _turn(tokenizer, 0, "what is two plus two?", "- It is 4.", score=-1.0, meta=_judged(-1, [HINT], -1.0)),
        _turn(tokenizer, 1, "name a fruit", "mango", score=1.0, meta=_judged(1, [], 1.0)),
        _turn(tokenizer, 2, "hello", "hi there", score=0.0, meta=_judged(0, [HINT, "Greet back warmly."], 0.0)),
        _turn(tokenizer, 3, "and now?", "ok", score=0.5, feedback="please keep it to one line", top=False),
    ])


def _context(tmp_path, runtime, name="scratch", current=None):
    return recipe_context(tmp_path / name, current, recipe="openclaw", runtime=runtime)


def test_the_contract_kit_passes(tmp_path, trainable_runtime, batch):
    # the kit's synthetic batch has no token ids: nothing trains, and no runtime is asked
    assert check_recipe(OpenClawRecipe(state_dir=tmp_path / "s0"), tmp_path / "synthetic") == (None, None)
    runtime = trainable_runtime
    recipe = OpenClawRecipe(lr=1e-2, lora_rank=4, lora_alpha=8, lora_lm_head=True, state_dir=tmp_path / "s1")
    first, second = check_recipe(recipe, tmp_path / "real", batch=batch,
                                 context=lambda scratch, current: recipe_context(scratch, current, recipe="openclaw",
                                                                                 runtime=runtime))
    assert (first.artifact_dir / "adapter" / "adapter_config.json").is_file()
    assert second.metadata["openclaw"]["metrics"]["turns"] == 4
    # the learner's checkpoint rides with the adapter; the second step counted on from the release
    assert read_learner_state(second.artifact_dir / "learner", "openclaw").counters == {"steps": 2, "turns": 8}


def test_declarations():
    recipe = OpenClawRecipe(max_staleness=2, top_k=5)
    assert recipe.update_target == "adapter" and recipe.batch_size == 16 and recipe.default_evaluator == "always"
    assert recipe.filters == []                # staleness is counted in lineage steps, by propose
    assert (recipe.max_staleness, OpenClawRecipe().max_staleness) == (2, 64)
    assert recipe.top_logprobs == 5            # what the runtime records for this recipe's scenarios
    with pytest.raises(ValueError, match="w_rl and w_opd"):
        OpenClawRecipe(w_rl=0, w_opd=0)
    with pytest.raises(ValueError, match=r"weight_decay must be a number of 0 or more, not -1"):
        OpenClawRecipe(weight_decay=-1)
    assert (OpenClawRecipe().lora.beta2, OpenClawRecipe().lora.weight_decay) == (0.98, 0.1)  # the reference's AdamW


def test_every_turn_says_how_it_trains(tmp_path, trainable_runtime, tokenizer, batch):
    retired = _turn(tokenizer, 4, "x", "y", score=0.0, meta=_judged(0, [], 0.0))
    no_tokens = Experience(report_id="rep5", scenario=SCENARIO, score=1.0, feedback=None, metadata={},
                           created_at=None, records=(chat_record("rec5", [{"role": "user", "content": "q"}], "a"),))
    recipe = OpenClawRecipe(lr=1e-3, lora_rank=4, lora_alpha=8, state_dir=tmp_path / "state")
    assert recipe.propose(Batch(SCENARIO, [retired, no_tokens]), None, _context(tmp_path, None, "s0")) is None
    cand = recipe.propose(Batch(SCENARIO, [*batch, retired, no_tokens]), None,
                          _context(tmp_path, trainable_runtime))
    meta = cand.metadata["openclaw"]
    by_id = {t.get("record_id"): t for t in meta["turns"]}
    assert meta["dispatch"] == {"hint_eval": 2, "anchor": 2, "hint_only": 1, "retired": 1}
    assert [t["dispatch"] for t in meta["turns"]] == ["hint_eval", "anchor", "hint_only", "hint_eval", "retired",
                                                      "anchor"]
    assert meta["dropped"] == {"retired": 1, "no_tokens": 1}
    assert by_id["rec3"]["source"] == "report" and by_id["rec3"]["hints"] == ["please keep it to one line"]
    assert by_id["rec0"]["eval_votes"] == [-1, -1, -1] and by_id["rec0"]["hints"] == [HINT]
    m = meta["metrics"]
    assert (m["turns"], m["opd_turns"]) == (4, 3)           # rec3 has no top-K capture: RL only
    assert m["reward_mean"] == pytest.approx((-1 + 1 + 0 + 0.5) / 4)
    # one JSON line per batch, with every turn (the empty batch too)
    lines = [json.loads(x) for x in (tmp_path / "state" / "openclaw" / SCENARIO / "batches.jsonl").read_text().splitlines()]
    assert [x["candidate"] for x in lines] == [False, True]
    assert lines[1]["turns"] == meta["turns"] and lines[1]["metrics"]["loss"] == m["loss"]


def test_the_teacher_reads_the_hint_after_the_last_user_message(tokenizer):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "first"},
                {"role": "assistant", "content": "a"}, {"role": "user", "content": "second"}]
    hinted = with_hint(messages, HINT)
    assert hinted[3]["content"] == "second" + HINT_PREFIX + HINT and messages[3]["content"] == "second"
    ids = teacher_prompt_ids(tokenizer, {"messages": messages}, "openai.chat", HINT)
    assert tokenizer.decode(ids).endswith("second" + HINT_PREFIX + HINT + "</s><|assistant|>")


def test_a_step_moves_the_policy_toward_the_hinted_teacher_and_away_from_a_bad_reward(tmp_path, trainable_runtime,
                                                                                      tokenizer, batch):
    recipe = OpenClawRecipe(lr=2e-2, lora_rank=4, lora_alpha=8, lora_lm_head=True, w_opd=0.0,
                            state_dir=tmp_path / "state")
    turn = recipe.turn_of(batch.items[0])[2]     # reward -1
    learner = Learner(recipe.algorithm, recipe.lora, trainable_runtime.base_model())
    turn.teacher_prompts = [turn.prompt_ids]
    before = recipe.algorithm.prepare(learner, turn).old_tok.sum()
    for _ in range(5):
        learner.step([turn])
    after = recipe.algorithm.prepare(learner, turn).old_tok.sum()
    assert after < before - 0.1                  # the punished reply became less likely

    # OPD alone pulls the student's top-K distribution toward the teacher's
    recipe = OpenClawRecipe(lr=5e-3, lora_rank=4, lora_alpha=8, lora_lm_head=True, w_rl=0.0, weight_decay=0.0,
                            state_dir=tmp_path / "state2")
    turn = recipe.turn_of(batch.items[2])[2]
    rec = batch.items[2].records[0]
    turn.teacher_prompts = [teacher_prompt_ids(tokenizer, rec.request, rec.route, h) for h in turn.hints]
    learner = Learner(recipe.algorithm, recipe.lora, trainable_runtime.base_model())

    def gap():
        p = recipe.algorithm.prepare(learner, turn)
        return float(((p.teacher_s - p.old_s).abs() * p.subset).sum())

    start = gap()
    for _ in range(6):
        learner.step([turn])
    assert gap() < 0.5 * start, start            # measured here: 2.40 -> 0.38


def test_a_rejected_candidates_training_continues_on_the_lineage(tmp_path, trainable_runtime, batch):
    recipe = OpenClawRecipe(lr=1e-2, lora_rank=4, lora_alpha=8, state_dir=tmp_path / "state")
    first = recipe.propose(batch, None, _context(tmp_path, trainable_runtime, "s1"))
    # rejected: serving never changed, and the next batch trains on from the lineage head
    second = recipe.propose(batch, None, _context(tmp_path, trainable_runtime, "s2"))
    assert (first.metadata["openclaw"]["learner_from"], second.metadata["openclaw"]["learner_from"]) == \
        ("new", "lineage step 1")
    assert read_learner_state(second.artifact_dir / "learner", "openclaw").counters["steps"] == 2
    assert second.metadata["lineage"]["step"] == 2 and second.metadata["lineage"]["steps_since_publish"] == 2
    adapters = [(c.artifact_dir / "adapter" / "adapter_model.safetensors").read_bytes() for c in (first, second)]
    assert adapters[0] != adapters[1]


def test_turns_sampled_more_than_max_staleness_lineage_steps_behind_are_dropped(tmp_path, trainable_runtime, batch):
    """The turns were sampled by the base model; the lineage's first snapshot was published and
    the lineage went one step further: with max_staleness 1 the base's turns are then two steps
    behind the head (stale: dropped, counted, the step skipped), while serving is one behind
    (the lineage goes on, no reset). Each trained batch records its policy lag."""
    import shutil
    from dataclasses import replace

    from reef_core import ActiveRelease, content_hash

    recipe = OpenClawRecipe(lr=1e-3, lora_rank=4, lora_alpha=8, max_staleness=1, state_dir=tmp_path / "state")
    first = recipe.propose(batch, None, _context(tmp_path, trainable_runtime, "s1"))
    shutil.copytree(first.artifact_dir, tmp_path / "rel1")
    serving = ActiveRelease(scenario=SCENARIO, release_id="rel1", content_hash="", path=tmp_path / "rel1")
    serving = replace(serving, content_hash=content_hash(tmp_path / "rel1"))          # published
    second = recipe.propose(batch, serving, _context(tmp_path, trainable_runtime, "s2", serving))
    assert [c.metadata["openclaw"]["metrics"]["lineage_lag_max"] for c in (first, second)] == [0, 1]
    assert second.metadata["lineage"]["lag_max"] == 1 and "policy lag max 1" in second.summary
    ctx = _context(tmp_path, trainable_runtime, "s3", serving)
    assert recipe.propose(batch, serving, ctx) is None
    assert (ctx.skip_kind, ctx.skip_counts) == ("stale", {"rollouts_stale": len(batch)})
    head = recipe.lineages.head(SCENARIO)
    assert head.step == 2 and head.last_reset is None


def test_a_batch_with_nothing_to_learn_from_proposes_no_candidate(tmp_path, trainable_runtime, tokenizer):
    """A turn of reward 0 whose hint is not distilled (``w_opd`` 0): the gradient is 0, so no
    candidate, the reason said and counted, and the lineage does not move."""
    zero = Batch(SCENARIO, [_turn(tokenizer, 2, "hello", "hi there", score=0.0, meta=_judged(0, [HINT], 0.0))])
    recipe = OpenClawRecipe(lr=1e-3, lora_rank=4, lora_alpha=8, w_opd=0.0, state_dir=tmp_path / "state")
    ctx = _context(tmp_path, trainable_runtime)
    assert recipe.propose(zero, None, ctx) is None
    assert ctx.skip_kind == "nothing_to_learn" and "the gradient is 0" in ctx.skip_reason
    assert recipe.lineages.head(SCENARIO) is None


def test_the_summary_reports_every_optimizer_step(tmp_path, trainable_runtime, batch):
    recipe = OpenClawRecipe(lr=1e-3, lora_rank=4, lora_alpha=8, steps_per_batch=2, state_dir=tmp_path / "state")
    cand = recipe.propose(batch, None, _context(tmp_path, trainable_runtime))
    detail = cand.metadata["openclaw"]["metrics"]["steps_detail"]
    assert len(detail) == 2 and all(s["grad_norm"] > 0 for s in detail)
    assert "loss by optimizer step " + ", ".join(f"{s['loss']:.4f}" for s in detail) in cand.summary


def test_a_backlog_of_batches_trains_one_learner_step_each_for_one_candidate(tmp_path, trainable_runtime, batch):
    """``max_batches``: the kernel hands over the batches that waited (here 2 of 2 turns); each is
    a learner step of its own, the lineage moves by both, and the metrics cover every turn."""
    recipe = OpenClawRecipe(lr=1e-3, lora_rank=4, lora_alpha=8, batch_size=2, max_batches=2,
                            state_dir=tmp_path / "state")
    assert recipe.max_batches == 2 and OpenClawRecipe().max_batches == 1
    cand = recipe.propose(batch, None, _context(tmp_path, trainable_runtime))
    metrics = cand.metadata["openclaw"]["metrics"]
    assert (metrics["turns"], metrics["learner_steps"], metrics["optimizer_steps"]) == (4, 2, 2)
    assert metrics["reward_mean"] == pytest.approx((-1.0 + 1.0 + 0.0 + 0.5) / 4)  # every turn, not the last step's
    assert read_learner_state(cand.artifact_dir / "learner", "openclaw").counters == {"steps": 2, "turns": 4}
    assert cand.metadata["lineage"]["step"] == 2 and "openclaw lineage step 2: 4 turn(s)" in cand.summary
    assert "loss by optimizer step " + ", ".join(f"{s['loss']:.4f}" for s in metrics["steps_detail"]) in cand.summary
    with pytest.raises(ValueError, match="max_batches"):
        OpenClawRecipe(max_batches=0)


def test_odd_experience_is_skipped_with_a_reason_not_fatal_to_the_step(tokenizer):
    """A client may post metadata under the judge's key, huge feedback, and records from another
    runtime or model: none of them may fail the step (it came back at every step, for good)."""
    from reef_recipe_openclaw.prm import MAX_HINT_CHARS

    recipe = OpenClawRecipe(lora_rank=4, lora_alpha=8)
    for vote in (5, "x", True, None):
        forged = _turn(tokenizer, 7, "q", "a", score=None, meta={"eval_score": vote, "hints": ["a hint long enough"]})
        assert recipe.turn_of(forged)[0] == "bad_metadata"
    long = _turn(tokenizer, 8, "q", "a", score=1.0, feedback="x" * 5_000_000)
    reason, entry, turn = recipe.turn_of(long)
    assert reason is None and [len(h) for h in turn.hints] == [MAX_HINT_CHARS] and len(entry["hints"][0]) == MAX_HINT_CHARS
    out_of_vocab = _turn(tokenizer, 9, "q", "a", score=1.0)
    assert recipe.turn_of(out_of_vocab, vocab_size=len(tokenizer))[0] is None
    assert recipe.turn_of(out_of_vocab, vocab_size=3)[0] == "bad_tokens"  # recorded from another model
    from dataclasses import replace

    def spoilt(**fields):
        exp = _turn(tokenizer, 10, "q", "a", score=1.0)
        return replace(exp, records=(replace(exp.records[0], **fields),))

    rec = out_of_vocab.records[0]
    assert recipe.turn_of(spoilt(logprobs=[None] * len(rec.logprobs)))[0] == "bad_tokens"  # a third-party runtime's
    assert recipe.turn_of(spoilt(top_logprobs=[[[-1, -0.5]] for _ in rec.top_logprobs]))[0] == "bad_tokens"
