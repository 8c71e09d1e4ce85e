"""The GEPA state stays bounded: ``max_archive`` keeps the archive (and with it the lineage and the
reflection's raw answers) to a fixed number of candidates over any number of growth steps."""

from __future__ import annotations

import copy
import json
import re

import pytest
from gepa_doubles import context, harness_text, publish, settings_with_tasks

from reef_core import Batch, Experience, ExperienceRecord
from reef_recipe_gepa import GepaRecipe, archive

# ------------------------------------------------------------------ archive.prune on a known archive

#: (parents, scores on tasks 0 and 1); 4 merges 2 and 3 (common ancestor 0), 6 is a later seed
ARCHIVE = [([None], (0, 0)), ([0], (1, 0)), ([1], (1, 0)), ([0], (0, 1)), ([2, 3], (1, 1)), ([4], (1, 0)),
           ([], (0, 0.5))]


def known_doc() -> dict:
    n = len(ARCHIVE)
    state = {
        "program_candidates": [{"system.md": f"v{i}"} for i in range(n)],
        "parent_program_for_candidate": [list(p) for p, _ in ARCHIVE],
        "prog_candidate_val_subscores": [{"0": float(a), "1": float(b)} for _, (a, b) in ARCHIVE],
        "prog_candidate_objective_scores": [{} for _ in range(n)],
        "pareto_front_valset": {"0": 1.0, "1": 1.0},
        "program_at_pareto_front_valset": {"0": [1, 2, 4, 5], "1": [3, 4]},
        "objective_pareto_front": {}, "program_at_pareto_front_objectives": {},
        "list_of_named_predictors": ["system.md"],
        "named_predictor_id_to_update_next_for_program_candidate": [0] * n,
        "i": 9, "num_full_ds_evals": n, "total_num_evals": 70, "num_metric_calls_by_discovery": list(range(n)),
        "adapter_state": {},
    }
    lineage = {str(i): {"kind": "reflective", "parents": [p for p in ps if p is not None], "raw_proposal": f"r{i}"}
               for i, (ps, _) in enumerate(ARCHIVE)}
    lineage["0"] = {"kind": "seed", "parents": []}
    lineage["4"] = {"kind": "merge", "parents": [2, 3], "ancestor": 0}
    lineage["6"] = {"kind": "seed", "parents": []}
    return {"state": state, "served": 2, "pending": 3, "gate_rejected": [5, 1], "lineage": lineage,
            "merge": {"due": 1, "tested": 1, "performed": [[(2, 3, 0)], [(2, 3, (2, 3))]], "last_found": False}}


def test_prune_keeps_the_served_the_best_and_the_front_and_renumbers_everything():
    doc = known_doc()
    # ranking: served 2, best mean 4 (also the only undominated one), then by mean, newer first: 5, 3, 1, 6, 0
    assert archive.prune(doc, 5) == [0, 6]
    state = archive.state_from_json(doc["state"])  # GEPA's own consistency check passes
    assert [c["system.md"] for c in state.program_candidates] == ["v1", "v2", "v3", "v4", "v5"]
    # the dropped seed leaves its children without parents; the merge keeps both of its parents
    assert state.parent_program_for_candidate == [[], [0], [], [1, 2], [3]]
    assert state.num_metric_calls_by_discovery == [1, 2, 3, 4, 5]
    assert state.program_at_pareto_front_valset == {0: {0, 1, 3, 4}, 1: {2, 3}}
    assert doc["served"] == 1 and doc["pending"] == 2 and doc["gate_rejected"] == [4, 0]
    assert doc["lineage"]["3"] == {"kind": "merge", "parents": [1, 2], "ancestor": None}
    assert doc["lineage"]["4"]["raw_proposal"] == "r5" and sorted(doc["lineage"]) == ["0", "1", "2", "3", "4"]
    assert doc["merge"]["performed"] == [[], [[1, 2, [1, 2]]]]  # the entry naming the dropped 0 is gone
    assert doc["pruned"] == 2 and doc["state"]["total_num_evals"] == 70


def test_prune_resolves_a_dropped_parent_to_its_nearest_kept_ancestors():
    doc = known_doc()
    assert archive.prune(doc, 3) == [0, 1, 3, 6]  # kept: 2 (served), 4 (best), 5
    state = archive.state_from_json(doc["state"])
    assert state.parent_program_for_candidate == [[], [0], [1]]  # 4's parent 3 was dropped, and 3's seed too
    assert state.program_at_pareto_front_valset == {0: {0, 1, 2}, 1: {1}}
    assert doc["pending"] is None and doc["gate_rejected"] == [2] and doc["merge"]["performed"] == [[], []]


def test_an_archive_within_the_bound_is_left_alone():
    doc = known_doc()
    before = copy.deepcopy(doc)
    assert archive.prune(doc, len(ARCHIVE)) == [] and doc == before


def test_max_archive_below_two_is_refused():
    with pytest.raises(ValueError, match="max_archive must be 2 or more"):
        GepaRecipe(max_archive=1)


# ------------------------------------------------------------------ many growth steps

TASKS = [{"id": f"t{k}", "prompt": f"Question {k}", "expected": f"S{k}"} for k in range(1, 4)]


class EchoHarness:
    """The task model: answers with the harness it was given."""

    def complete(self, body, release, *, timeout_s=None):
        text = "Said: " + harness_text(release)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


class OneMoreStep:
    """Reflection appends the next token (S1, S2, ...) after a long rationale; the judge scores an
    answer by how many tokens it holds, so every proposal is better on the minibatch and the
    archive gains candidates at every step for as long as the run goes on."""

    def __call__(self, prompt):
        if prompt.startswith("You grade"):
            return f"{len(re.findall(r'S[0-9]+', prompt.rsplit('The new answer:', 1)[1])) / 1000}\nmore steps"
        current = prompt.split("```\n", 1)[1].split("\n```", 1)[0].strip()
        return "Thinking it over. " * 100 + f"\n```\n{current} S{len(re.findall(r'S[0-9]+', current)) + 1}\n```"


def reports(step: int, release_id: str | None) -> Batch:
    items = []
    for i in range(3):
        rec = ExperienceRecord(
            id=f"rec{step}-{i}", scenario="default", session=None, release_id=release_id, created_at=None,
            status="ok", model="m", route="chat.completions",
            request={"model": "m", "messages": [{"role": "user", "content": f"Question {step}.{i}"}]},
            response={"choices": [{"index": 0, "message": {"role": "assistant", "content": "Said: nothing"}}]})
        items.append(Experience(report_id=f"rep{step}-{i}", scenario="default", score=0.0, feedback="More steps.",
                                metadata={}, created_at=None, records=(rec,)))
    return Batch("default", items)


def test_the_state_stays_bounded_over_many_growth_steps(tmp_path):
    settings = settings_with_tasks(tmp_path / "s", tasks=TASKS)
    state_file = tmp_path / "state" / "recipes" / "gepa" / "default" / "state.json"
    current, sizes, published = None, [], 0
    for step in range(10):
        recipe = GepaRecipe(reflection=OneMoreStep(), state_dir=tmp_path / "state", concurrency=1,
                            max_metric_calls=12, max_train=6, max_archive=4)
        cand = recipe.propose(reports(step, current.release_id if current else None), current,
                              context(tmp_path / f"scratch-{step}", current, settings, EchoHarness()))
        doc = json.loads(state_file.read_text())
        kept = len(doc["state"]["program_candidates"])
        assert kept <= 4 and sorted(doc["lineage"], key=int) == [str(i) for i in range(kept)]
        # the served index still names the harness this step was served with
        assert doc["state"]["program_candidates"][doc["served"]] == {"system.md": harness_text(current)}
        if cand is not None:  # the gate selects it: it is served from now on
            in_release = json.loads((cand.artifact_dir / "gepa" / "state.json").read_text())
            assert len(in_release["state"]["program_candidates"]) <= 4
            current = publish(cand.artifact_dir, tmp_path / f"rel{step}", f"rel{step}")
            assert in_release["state"]["program_candidates"][in_release["served"]] == {
                "system.md": harness_text(current)}
            published += 1
        sizes.append(state_file.stat().st_size)
    assert doc["pruned"] >= 10 and published >= 2  # the archive kept turning over and the recipe kept learning
    # past the first steps the file no longer grows with the steps (only the texts' own length does)
    assert max(sizes[5:]) < 1.25 * sizes[4], sizes
