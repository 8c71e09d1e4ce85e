"""The gepa recipe with deterministic offline models: it learns, keeps its state, counts its budget."""

from __future__ import annotations

import json

import pytest
from gepa_doubles import (
    KEYWORD,
    LESSON,
    KeywordTaskModel,
    ScriptedReflection,
    context,
    publish,
    report_batch,
    settings_with_tasks,
)

from reef_core import ConfigError
from reef_core.testing import check_recipe
from reef_recipe_gepa import GepaRecipe, default_feedback, train_examples


def _recipe(tmp_path, reflection=None, **options):
    return GepaRecipe(reflection=reflection or ScriptedReflection(), state_dir=tmp_path / "state",
                      concurrency=1, **options)


def test_learns_the_keyword_and_validation_rises(tmp_path):
    settings = settings_with_tasks(tmp_path / "s")
    recipe = _recipe(tmp_path, max_metric_calls=20)
    cand = recipe.propose(report_batch(), None, context(tmp_path / "scratch", None, settings))
    assert cand is not None
    system = (cand.artifact_dir / "harness" / "system.md").read_text()
    assert KEYWORD in system and system == LESSON
    meta = cand.metadata["gepa"]
    assert meta["validation_mean"] == 1.0 and meta["served_validation_mean"] == 0.0
    assert meta["validation"] == {"t0": 1.0, "t1": 1.0, "t2": 1.0, "t3": 1.0}
    assert meta["parents"] == [0] and meta["component"] == "system.md" and meta["kind"] == "reflective"
    assert meta["minibatch_scores"] == {"parent": [0.0, 0.0, 0.0], "candidate": [1.0, 1.0, 1.0]}
    assert LESSON in meta["raw_proposal"]["system.md"]
    state = json.loads((cand.artifact_dir / "gepa" / "state.json").read_text())
    assert state["served"] == meta["archive_index"] and state["pending"] is None


def test_state_survives_a_restart_and_a_rollback_reseeds(tmp_path):
    settings = settings_with_tasks(tmp_path / "s")
    first = _recipe(tmp_path, max_metric_calls=20).propose(report_batch(), None,
                                                            context(tmp_path / "scratch-1", None, settings))
    served = publish(first.artifact_dir, tmp_path / "rel1", "rel1")

    # a restart: a new recipe object on the same state directory resumes the archive
    model = KeywordTaskModel()
    again = _recipe(tmp_path, max_metric_calls=20)
    assert again.propose(report_batch(start=3), served, context(tmp_path / "scratch-2", served, settings, model)) is None
    doc = json.loads((tmp_path / "state" / "recipes" / "gepa" / "default" / "state.json").read_text())
    assert doc["served"] == first.metadata["gepa"]["archive_index"]  # the published candidate is now served
    assert len(doc["state"]["program_candidates"]) == 2 and doc["steps"] == 2
    assert len(doc["train"]) == 6
    assert doc["lineage"]["1"]["component"] == "system.md"

    # the same archive read back from the release alone (a new state directory, e.g. another host)
    fresh = GepaRecipe(reflection=ScriptedReflection(), state_dir=tmp_path / "other", concurrency=1,
                       max_metric_calls=20)
    fresh.propose(report_batch(start=6), served, context(tmp_path / "scratch-3", served, settings))
    other = json.loads((tmp_path / "other" / "recipes" / "gepa" / "default" / "state.json").read_text())
    assert len(other["state"]["program_candidates"]) == 2 and other["served"] == doc["served"]

    # a rollback to a harness the archive does not serve: it enters as a new seed
    (tmp_path / "rolled" / "harness").mkdir(parents=True)
    (tmp_path / "rolled" / "harness" / "system.md").write_text("You are terse.")
    rolled = publish(tmp_path / "rolled", tmp_path / "rel0", "rel0")
    cand = again.propose(report_batch(start=9), rolled, context(tmp_path / "scratch-4", rolled, settings))
    doc = json.loads((tmp_path / "state" / "recipes" / "gepa" / "default" / "state.json").read_text())
    seed = len(doc["state"]["program_candidates"]) - 1
    assert doc["lineage"][str(seed)]["kind"] == "seed" and doc["served"] == seed
    assert doc["state"]["program_candidates"][seed] == {"system.md": "You are terse."}
    assert doc["state"]["parent_program_for_candidate"][seed] == []
    # the archive's best (the learned lesson) beats the rolled-back seed, so it is proposed again
    assert cand is not None and cand.metadata["gepa"]["sync"].startswith("the served harness entered the archive")
    assert KEYWORD in (cand.artifact_dir / "harness" / "system.md").read_text()


def test_a_candidate_the_gate_rejected_is_not_proposed_again(tmp_path):
    settings = settings_with_tasks(tmp_path / "s")
    recipe = _recipe(tmp_path, max_metric_calls=20)
    assert recipe.propose(report_batch(), None, context(tmp_path / "scratch-1", None, settings)) is not None
    # nothing was published: the next step still sees no release
    assert recipe.propose(report_batch(start=3), None, context(tmp_path / "scratch-2", None, settings)) is None
    doc = json.loads((tmp_path / "state" / "recipes" / "gepa" / "default" / "state.json").read_text())
    assert doc["gate_rejected"] == [1] and doc["served"] == 0


def test_budget_accounting(tmp_path):
    settings = settings_with_tasks(tmp_path / "s")
    model = KeywordTaskModel()
    recipe = _recipe(tmp_path, max_metric_calls=10, max_total_metric_calls=24, use_merge=False)
    cand = recipe.propose(report_batch(), None, context(tmp_path / "scratch-1", None, settings, model))
    budget = cand.metadata["gepa"]["budget"]  # the records of first boot came from no release: reused
    # seed validation (4, outside the step's budget); iteration 1: the served parent's minibatch
    # reuses the recorded answers (0 calls), the child's minibatch (3), its validation (4);
    # iteration 2: the new parent's minibatch (3) is perfect, skipped; 10 spent, the step stops
    assert budget == {"step_limit": 10, "step_used": 10, "total_used": 14, "total_limit": 24, "episodes_run": 14}
    assert model.calls == 14
    served = publish(cand.artifact_dir, tmp_path / "rel1", "rel1")
    # the new reports' answers came from another release: each minibatch is re-run (3 calls) on
    # the served candidate, which is perfect, so GEPA skips it; the budget is checked before each
    # iteration (as GEPA does), so the iteration started at 23 of 24 finishes at 26
    recipe.propose(report_batch(start=3), served, context(tmp_path / "scratch-2", served, settings))
    doc = json.loads((tmp_path / "state" / "recipes" / "gepa" / "default" / "state.json").read_text())
    assert doc["budget"]["total_used"] == 26 and doc["budget"]["step_used"] == 12
    model = KeywordTaskModel()  # the total is spent: no episode at all
    assert recipe.propose(report_batch(start=6), served, context(tmp_path / "scratch-3", served, settings,
                                                                  model)) is None
    assert model.calls == 0


@pytest.mark.parametrize("options, message", [
    ({"max_metric_calls": 0}, "max_metric_calls must be a positive number"),
    ({"max_metric_calls": 20, "max_total_metric_calls": 10}, "max_total_metric_calls (10) is below"),
])
def test_degenerate_budgets_are_refused(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GepaRecipe(**options)


def test_a_step_budget_below_one_iteration_is_refused(tmp_path):
    settings = settings_with_tasks(tmp_path / "s")
    with pytest.raises(ConfigError, match=r"max_metric_calls=5 cannot pay for one GEPA iteration.*at least 10"):
        _recipe(tmp_path, max_metric_calls=5).propose(report_batch(), None,
                                                      context(tmp_path / "scratch", None, settings))


def test_refuses_to_run_without_a_validation_set(tmp_path):
    settings = settings_with_tasks(tmp_path / "s", tasks=None, evaluator="always")
    with pytest.raises(ConfigError, match=r"evaluator\.tasks is not set"):
        _recipe(tmp_path).propose(report_batch(), None, context(tmp_path / "scratch", None, settings))


def test_reports_without_feedback_get_one_that_restates_the_score(tmp_path):
    examples = train_examples(report_batch(1, feedback=None, score=0.25))
    assert examples[0]["feedback"] == default_feedback(0.25)
    assert "0.25" in examples[0]["feedback"]


def test_a_responses_route_record_trains_as_the_chat_request_it_stands_for():
    """Codex and the Agents SDK send /v1/responses bodies (instructions + input items): the train
    example replays them as a chat request, so the episode asks what the user asked."""
    from dataclasses import replace

    batch = report_batch(1)
    exp = batch.items[0]
    rec = replace(exp.records[0], route="openai.responses",
                  request={"model": "m", "instructions": "Be brief.", "input": "Question 0: what?", "store": False})
    (example,) = train_examples(replace(batch, items=[replace(exp, records=(rec,))]))
    assert example["request"]["messages"] == [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Question 0: what?"}]
    assert "input" not in example["request"] and "instructions" not in example["request"]


def test_keeps_the_recipe_contract(tmp_path):
    settings = settings_with_tasks(tmp_path / "s")

    def make_ctx(scratch, current):
        return context(scratch, current, settings)

    first, second = check_recipe(_recipe(tmp_path, max_metric_calls=20), tmp_path / "kit",
                                 batch=report_batch(), context=make_ctx)
    assert first is not None and KEYWORD in (first.artifact_dir / "harness" / "system.md").read_text()
    assert second is None  # the kit serves the first candidate: nothing better is left to find


def test_validation_episodes_ask_what_task_suite_asks():
    """One copy of the task-to-request conversion: the kit's, as ``task_suite`` uses it."""
    from reef_core.kit import task_body
    from reef_recipe_gepa import adapter, data

    assert adapter.task_body is task_body and not hasattr(data, "task_body")
