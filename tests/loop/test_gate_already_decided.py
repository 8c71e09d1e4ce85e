"""The gate never decides the same artifact twice against the same serving release: a retried
batch that reproduces an artifact the gate already rejected (or left undecided) gets that
verdict again without a single episode, counted on ``/metrics`` and named in the candidate's
evaluation. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from reef_core.compose import build_reef
from reef_core.plugins import get_plugins
from reef_core.serve.metrics import Metrics
from reef_core.types import Candidate, Decision, Evaluation

from .conftest import UndecidedEvaluator, add_plugin, feedback_rules_config, grow_steps, settings_for
from .test_experience_return import Down, _seed


class SameRuleRecipe:
    """Proposes the same harness from every batch (a learner that restarts from the same state
    with the same seed: byte-identical candidates)."""

    update_target = "harness"
    filters = ()
    default_evaluator = "counting_reject"

    def __init__(self, batch_size: int = 1, rule: str = "- Be brief."):
        self.batch_size = batch_size
        self.rule = rule

    def propose(self, batch, current, ctx):
        art = ctx.new_artifact()
        (art / "harness").mkdir(exist_ok=True)
        (art / "harness" / "rules.md").write_text(self.rule + "\n")
        return Candidate(scenario=batch.scenario, recipe="same_rule", artifact_dir=art, summary="the same rule")


class CountingReject:
    evaluated: list[str] = []

    def evaluate(self, candidate, current, ctx):
        CountingReject.evaluated.append(candidate.id)
        return Evaluation(evaluator="counting_reject", candidate_scores=[0.0], current_scores=[1.0], tasks=["t"])

    def decide(self, evaluation):
        return Decision("reject", "the candidate never wins")


class CountingUndecided(UndecidedEvaluator):
    evaluated: list[str] = []

    def evaluate(self, candidate, current, ctx):
        CountingUndecided.evaluated.append(candidate.id)
        return super().evaluate(candidate, current, ctx)


@pytest.mark.parametrize("gate,verdict", [(CountingReject, "rejected"), (CountingUndecided, "undecided")])
def test_a_retried_batch_that_reproduces_a_decided_artifact_is_not_gated_again(tmp_path, store_url, gate, verdict):
    gate.evaluated = []
    add_plugin("recipe", "same_rule", SameRuleRecipe)
    add_plugin("evaluator", "counting", gate)
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "counting"})
    config["recipe"] = {"name": "same_rule", "batch_size": 1}
    config["loop"].update(retry_after_new=0, max_attempts=3)
    config["record_store"] = {"url": store_url}
    reef = build_reef(settings_for(tmp_path, Down, config), get_plugins(), background=False)
    metrics = Metrics()
    reef.register(metrics, name="test.metrics")
    _seed(reef.store, scenario="default")
    first, second, third = grow_steps(reef, 3)
    assert [s.outcome for s in (first, second, third)] == [verdict] * 3
    assert gate.evaluated == [first.candidate_id]                  # gated once, never again
    for again in (second, third):
        row = reef.store.get_candidate(again.candidate_id)
        assert row.evaluation["metrics"]["already_decided"] in (first.candidate_id, second.candidate_id)
        assert "already decided this artifact" in row.reason and "not evaluated again" in row.reason
        assert row.artifact["content_hash"] == reef.store.get_candidate(first.candidate_id).artifact["content_hash"]
    assert metrics.registry.get_sample_value("reef_gate_already_decided_total",
                                             {"scenario": "default", "recipe": "same_rule"}) == 2


def test_another_artifact_or_another_serving_release_is_gated(tmp_path, store_url):
    CountingReject.evaluated = []
    add_plugin("recipe", "same_rule", SameRuleRecipe)
    add_plugin("evaluator", "counting", CountingReject)
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "counting"})
    config["recipe"] = {"name": "same_rule", "batch_size": 1}
    config["loop"].update(retry_after_new=0, max_attempts=3)
    config["record_store"] = {"url": store_url}
    reef = build_reef(settings_for(tmp_path, Down, config), get_plugins(), background=False)
    _seed(reef.store, scenario="default")
    [first] = grow_steps(reef, 1)
    row = reef.store.get_candidate(first.candidate_id)
    chash = row.artifact["content_hash"]
    assert reef.store.decided_candidate("default", chash, None).id == first.candidate_id
    assert reef.store.decided_candidate("default", chash, "rel-other") is None      # another serving release
    assert reef.store.decided_candidate("default", "0" * 64, None) is None           # another artifact
    assert reef.store.decided_candidate("other", chash, None) is None                # another scenario
    reef.learning.plan("default").recipe.rule = "- Cite sources."
    [second] = grow_steps(reef, 1)
    assert second.outcome == "rejected" and CountingReject.evaluated == [first.candidate_id, second.candidate_id]
