"""/metrics' learning series: decisions per recipe and outcome, and a recipe's step metrics."""

from __future__ import annotations

from pathlib import Path

from reef_core.serve.metrics import RECIPE_METRIC_NAMES, Metrics
from reef_core.types import Candidate, Decision


def _candidate(metrics, recipe="sao", scenario="s1"):
    return Candidate(scenario=scenario, recipe=recipe, artifact_dir=Path("."), metadata={recipe: {"metrics": metrics}})


def test_a_recipes_step_metrics_are_gauges_of_the_latest_candidate():
    m = Metrics()
    m.candidate_evaluated(_candidate({"pg_clipfrac": 0.25, "rollouts_used": 32, "actor_updated": True,
                                      "steps_detail": [{"x": 1}], "mode": "sao"}), None, Decision("reject"))
    m.candidate_evaluated(_candidate({"pg_clipfrac": 0.5}), None, Decision("select"))
    text = m.render().decode()
    assert 'reef_recipe_step_metric{name="pg_clipfrac",recipe="sao",scenario="s1"} 0.5' in text
    assert 'reef_recipe_step_metric{name="rollouts_used",recipe="sao",scenario="s1"} 32.0' in text
    assert 'reef_recipe_step_metric{name="actor_updated",recipe="sao",scenario="s1"} 1.0' in text
    assert 'name="steps_detail"' not in text and 'name="mode"' not in text  # numbers only
    assert 'reef_candidates_evaluated_total{outcome="reject",recipe="sao",scenario="s1"} 1.0' in text
    assert 'reef_candidates_evaluated_total{outcome="select",recipe="sao",scenario="s1"} 1.0' in text


def test_metric_names_per_recipe_are_bounded_and_metadata_without_metrics_is_fine():
    m = Metrics()
    m.candidate_evaluated(_candidate({f"m{i}": i for i in range(RECIPE_METRIC_NAMES + 10)}), None, Decision("select"))
    m.candidate_evaluated(Candidate(scenario="s1", recipe="basic", artifact_dir=Path("."), metadata={"basic": "x"}),
                          None, Decision("error"))
    text = m.render().decode()
    assert text.count("reef_recipe_step_metric{") == RECIPE_METRIC_NAMES
    assert 'reef_candidates_evaluated_total{outcome="error",recipe="basic",scenario="s1"} 1.0' in text


def test_scenario_labels_stay_bounded():
    m = Metrics(scenario_labels=1)
    for s in ("a", "b", "c"):
        m.candidate_evaluated(_candidate({"loss": 1.0}, scenario=s), None, Decision("select"))
    text = m.render().decode()
    assert 'reef_recipe_step_metric{name="loss",recipe="sao",scenario="a"} 1.0' in text
    assert 'scenario="_other"' in text and 'scenario="b"' not in text


def test_a_lineage_snapshots_stale_rollouts_and_reset_are_counted():
    m = Metrics()
    lineage = {"head": "h1", "step": 3, "rollouts_stale": 5, "reset": "the KL bound"}
    for stale in (5, True, -1, "7"):   # only a positive count counts
        cand = Candidate(scenario="s1", recipe="sao", artifact_dir=Path("."),
                         metadata={"lineage": {**lineage, "rollouts_stale": stale}})
        m.candidate_evaluated(cand, None, Decision("reject"))
    labels = {"scenario": "s1", "recipe": "sao"}
    assert m.registry.get_sample_value("reef_lineage_rollouts_stale_total", labels) == 5
    assert m.registry.get_sample_value("reef_lineage_resets_total", labels) == 4
