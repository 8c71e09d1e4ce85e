"""The adapter's scratch releases under the thread pool that runs a batch's episodes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from reef_recipe_gepa import ReefHarnessAdapter


def test_concurrent_episodes_of_one_candidate_share_one_scratch_release(tmp_path):
    """Every episode of a batch asks for its candidate's release at once; building it twice
    (the second build deleting the first's directory under it) failed a growth step."""
    adapter = ReefHarnessAdapter(SimpleNamespace(scenario="s"), base=None, served={"system.md": "old"}, graders={},
                                 judge_lm=None, model="m", params={}, episode_timeout_s=5, concurrency=8,
                                 scratch=tmp_path / "scratch")
    candidate = {"system.md": "new instruction"}
    start = threading.Barrier(8)

    def one(_):
        start.wait()
        return adapter.release_for(candidate)

    with ThreadPoolExecutor(8) as pool:
        releases = list(pool.map(one, range(8)))
    assert len({id(r) for r in releases}) == 1
    assert (releases[0].path / "harness" / "system.md").read_text() == "new instruction"


def test_a_grader_that_returns_no_finite_score_scores_0(tmp_path):
    """GEPA ranks its candidates by these scores: an infinite one would beat every other."""
    answer = {"choices": [{"message": {"role": "assistant", "content": "Paris"}}]}
    ctx = SimpleNamespace(scenario="s", runtime=SimpleNamespace(dialect="openai"),
                          complete=lambda body, release, timeout_s=None: answer)
    for bad in (float("inf"), float("nan")):
        adapter = ReefHarnessAdapter(ctx, base=None, served={"system.md": "old"}, graders={"contains": lambda o, t, bad=bad: bad},
                                     judge_lm=None, model="m", params={}, episode_timeout_s=5, concurrency=1,
                                     scratch=tmp_path / str(bad))
        val = {"kind": "val", "task": {"id": "t", "prompt": "Capital of France?", "expected": "Paris",
                                       "grader": "contains"}}
        out = adapter.evaluate([val], {"system.md": "new"}, capture_traces=True)
        assert out.scores == [0.0] and "not a finite score" in out.trajectories[0]["feedback"]
