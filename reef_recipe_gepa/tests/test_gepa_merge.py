"""GEPA's merge in the recipe: two lineages, each fixing part of the validation set through a
different component, are merged into a candidate that fixes both parts.

The toy: the answer names every word (ALPHA, BETA, GAMMA) the harness holds. The served harness
holds GAMMA in ``system.md``; reflection rewrites ``system.md`` to teach ALPHA (losing GAMMA) and
``rules.md`` to teach BETA. Candidate 1 (ALPHA) and candidate 2 (GAMMA + BETA) are siblings on
the Pareto front; GEPA's merge takes each one's changed component: ALPHA + BETA, the best mean.
The validation suite has four tasks, fewer than GEPA's default merge overlap floor (five).
"""

from __future__ import annotations

import json

from gepa_doubles import RewritingReflection, WordsTaskModel, context, settings_with_tasks

from reef_core import ActiveRelease, Batch, Experience, ExperienceRecord
from reef_recipe_gepa import GepaRecipe

WORDS = ("ALPHA", "BETA", "GAMMA")
TASKS = [{"id": "a0", "prompt": "Question a0", "expected": "ALPHA"},
         {"id": "a1", "prompt": "Question a1", "expected": "ALPHA"},
         {"id": "b0", "prompt": "Question b0", "expected": "BETA"},
         {"id": "c0", "prompt": "Question c0", "expected": "GAMMA"}]
SERVED = {"system.md": "Be kind. GAMMA.", "rules.md": "Be brief."}
REWRITES = {"Be kind. GAMMA.": "Always say ALPHA.", "Be brief.": "Always say BETA."}
MERGED = {"system.md": "Always say ALPHA.", "rules.md": "Always say BETA."}


def served_release(tmp_path) -> ActiveRelease:
    root = tmp_path / "rel0"
    (root / "harness").mkdir(parents=True)
    for name, text in SERVED.items():
        (root / "harness" / name).write_text(text)
    return ActiveRelease(scenario="default", release_id="rel0", content_hash="rel0", path=root)


def reports(start: int, n: int = 3) -> Batch:
    """Reports on answers the served release gave, each with a reference any taught word meets."""
    items = []
    for i in range(start, start + n):
        rec = ExperienceRecord(
            id=f"rec{i}", scenario="default", session=None, release_id="rel0", created_at=None, status="ok",
            model="m", route="chat.completions",
            request={"model": "m", "messages": [{"role": "user", "content": f"Live question {i}"}]},
            response={"choices": [{"index": 0, "message": {"role": "assistant", "content": "I say GAMMA."}}]})
        items.append(Experience(report_id=f"rep{i}", scenario="default", score=0.0, feedback="Say ALPHA or BETA.",
                                metadata={"pattern": "ALPHA|BETA"}, created_at=None, records=(rec,)))
    return Batch("default", items)


def _recipe(tmp_path, **options) -> GepaRecipe:
    return GepaRecipe(reflection=RewritingReflection(REWRITES), state_dir=tmp_path / "state", concurrency=1,
                      seed=0, **options)


def _state(tmp_path) -> dict:
    return json.loads((tmp_path / "state" / "recipes" / "gepa" / "default" / "state.json").read_text())


def test_two_lineages_merge_into_the_proposed_candidate(tmp_path):
    settings = settings_with_tasks(tmp_path / "s", tasks=TASKS)
    current = served_release(tmp_path)
    cand = _recipe(tmp_path, max_metric_calls=60).propose(
        reports(0), current, context(tmp_path / "scratch", current, settings, WordsTaskModel(WORDS)))

    doc = _state(tmp_path)
    programs = doc["state"]["program_candidates"]
    assert programs[:3] == [SERVED, {**SERVED, "system.md": "Always say ALPHA."},
                            {**SERVED, "rules.md": "Always say BETA."}]
    merged = programs.index(MERGED)
    assert doc["state"]["parent_program_for_candidate"][merged] == [1, 2]
    lineage = doc["lineage"][str(merged)]
    assert (lineage["kind"], lineage["parents"], lineage["ancestor"]) == ("merge", [1, 2], 0)
    assert lineage["component"] is None and lineage["raw_proposal"] is None
    assert sum(lineage["minibatch_after"]) >= sum(lineage["minibatch_before"])  # GEPA's acceptance
    assert doc["merge"]["tested"] == 1 and [1, 2, 0] in doc["merge"]["performed"][0]

    # the merge has the best validation mean (3 of 4), so it is what the step proposes
    assert cand is not None
    meta = cand.metadata["gepa"]
    assert meta["kind"] == "merge" and meta["parents"] == [1, 2] and meta["archive_index"] == merged
    assert meta["validation"] == {"a0": 1.0, "a1": 1.0, "b0": 1.0, "c0": 0.0}
    assert sorted(meta["changed_components"]) == ["rules.md", "system.md"]
    for name, text in MERGED.items():
        assert (cand.artifact_dir / "harness" / name).read_text() == text


def test_a_merge_scheduled_at_the_end_of_a_step_happens_in_the_next(tmp_path):
    """GEPA tries a merge in the iteration after one that found a program; when that program came
    in a step's last iteration, the next step's first iteration is the merge."""
    settings = settings_with_tasks(tmp_path / "s", tasks=TASKS)
    current = served_release(tmp_path)
    # 17 episodes: candidate 1 (3 minibatch + 4 validation), a skipped perfect parent (3),
    # candidate 2 (3 + 4); the step stops right after candidate 2 is accepted
    first = _recipe(tmp_path, max_metric_calls=17).propose(
        reports(0), current, context(tmp_path / "scratch-1", current, settings, WordsTaskModel(WORDS)))
    doc = _state(tmp_path)
    assert [doc["lineage"][str(i)]["kind"] for i in range(len(doc["lineage"]))] == ["seed", "reflective", "reflective"]
    assert doc["merge"]["due"] == 2 and doc["merge"]["last_found"] is True
    assert first is not None and first.metadata["gepa"]["kind"] == "reflective"

    # the next step (a restart in between: a new recipe object on the same state directory)
    cand = _recipe(tmp_path, max_metric_calls=17).propose(
        reports(3), current, context(tmp_path / "scratch-2", current, settings, WordsTaskModel(WORDS)))
    doc = _state(tmp_path)
    assert doc["state"]["program_candidates"][3] == MERGED
    assert doc["lineage"]["3"]["kind"] == "merge" and doc["lineage"]["3"]["parents"] == [1, 2]
    assert cand is not None and cand.metadata["gepa"]["archive_index"] == 3
