"""The discovery bench driver (bench/learning_discovery.py): its pure pieces, and one slow smoke run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import learning_discovery as ld  # noqa: E402


def _side(bests, valid):
    return ld.SideResult(history=[{"step": i, "samples": 16, "archive_best": b, "valid_fraction": v}
                                  for i, (b, v) in enumerate(zip(bests, valid))])


def test_budget_becomes_whole_steps():
    bench = ld.DiscoveryBench(groups=2, rollouts=8, budget=400)
    assert (bench.steps, bench.samples) == (25, 400)
    assert ld.DiscoveryBench(groups=2, rollouts=8, budget=40).samples == 32
    assert ld.parse(["tttd", "--budget", "64", "--seeds", "2"])[0].steps == 4
    with pytest.raises(SystemExit):
        ld.parse(["tttd", "--budget", "8"])


def test_model_flag_serves_and_trains_a_local_model_directory(tmp_path):
    import learning

    default = ld.local_runtime(ld.parse(["tttd"])[0], learning.Runtime)
    assert default.overrides == ("runtime=local",) and default.options == {}
    bench = ld.parse(["tttd", "--model", str(tmp_path), "--device", "cuda"])[0]
    runtime = ld.local_runtime(bench, learning.Runtime)
    assert runtime.overrides == ("runtime=local",)
    assert runtime.options == {"model": str(tmp_path), "device": "cuda"}
    assert str(tmp_path) in runtime.description and "cuda" in runtime.description
    with pytest.raises(SystemExit, match="not a directory"):
        ld.parse(["tttd", "--model", str(tmp_path / "missing")])


def test_server_config_differs_only_in_the_variant():
    bench = ld.DiscoveryBench()
    a, b = ld.server_config(bench, "tttd", 1), ld.server_config(bench, "search-only", 1)
    assert a["recipe"].pop("variant") == "tttd" and b["recipe"].pop("variant") == "search-only"
    assert a == b
    assert a["recipe"]["groups_per_step"] * a["recipe"]["rollouts_per_group"] == 16
    assert a["loop"]["enabled"] is True


def test_summary_line_and_table():
    results = [
        ld.DiscoverySeed(0, {"tttd": _side([0.3, 0.6], [0.25, 1.0]), "search-only": _side([0.3, 0.4], [0.25, 0.5])}),
        ld.DiscoverySeed(1, {"tttd": _side([0.2, 0.5], [0.5, 1.0]), "search-only": _side([0.2, 0.55], [0.5, 0.5])}),
    ]
    line = ld.summary("tttd", results, 32, 3.04)
    assert line == ("tttd: best 0.550±0.071 vs search-only 0.475±0.106 at 32 samples, valid 38%→100% vs 38%→50%, "
                    "1/2 seeds above search-only, 3.0 min")
    def trained(kl_only):
        return {"status": "published", "artifact": {"metadata": {"tttd": {"metrics": {"kl_only": kl_only}}}}}

    results[0].sides["tttd"].steps = ld.step_kinds([
        trained(False), trained(True), {"status": "skipped", "artifact": None}, {"status": "error", "summary": "x"}])
    table = ld.seed_table(results)
    assert "0 | 0.6000 | 0.4000 | 25%→100% | 25%→50% | 1/1/1 | " in table
    assert "1 | 0.5000 | 0.5500 | 50%→100% | 50%→50% | - | " in table  # not counted: unknown


def test_a_failed_side_counts_as_nothing():
    side = ld.SideResult(error="StepFailed: x")
    assert (side.best, side.samples, side.valid("last")) == (0.0, 0, 0.0)
    seed = ld.DiscoverySeed(0, {"tttd": side, "search-only": _side([0.1], [0.5])})
    assert not seed.above and "errors" in ld.seed_table([seed])


@pytest.mark.slow
def test_smoke_one_seed_tiny_budget(capsys):
    """Both real servers (the embedded SmolLM2) for two steps of a 2x4 grid."""
    assert ld.main(["tttd", "--seeds", "1", "--budget", "16", "--rollouts", "4", "--lora-rank", "8"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    last = out[-1]
    assert last.startswith("tttd: best ") and "at 16 samples" in last and "/1 seeds above search-only" in last
    # the learner's steps, counted from the server's candidates: every one of the 2 grids is one
    import re

    [row] = [line for line in out if line.startswith("0 | ")]
    kinds = re.search(r"\| (\d+)/(\d+)/(\d+) \|", row)
    assert kinds and sum(map(int, kinds.groups())) == 2, row


def test_equal_bests_up_to_float_noise_are_not_above():
    noise = ld.DiscoverySeed(0, {"tttd": _side([0.2, 0.2 + 1e-15], [0.2, 0.8]),
                                 "search-only": _side([0.2, 0.2], [0.2, 0.2])})
    better = ld.DiscoverySeed(1, {"tttd": _side([0.2, 0.2001], [0.2, 0.8]), "search-only": _side([0.2, 0.2], [0.2, 0.2])})
    assert not noise.above and better.above


def _edits(task, solution, values):
    """``solution`` with one of its numbers replaced by each of ``values`` in turn."""
    nums = solution.split()
    return [" ".join(nums[:i] + [f"{v:.4f}"] + nums[i + 1:]) for i in range(len(nums)) for v in values]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20))
def test_no_one_number_edit_beats_spread5s_seed(values):
    """Why ``spread5`` was no test of discovery: its evenly spaced seed keeps a 0.05 gap after any
    one number changes, and SmolLM2-135M's valid answers are edits of the parent."""
    from reef_recipe_tttd import load_task

    task = load_task("spread5")
    [seed] = task.seeds()
    best = task.verify(seed).raw
    assert all(task.verify(edit).raw <= best + 1e-12 for edit in _edits(task, seed, values))


def test_the_default_task_leaves_room_a_one_number_edit_can_take():
    """The bench's default task: its seed is far below the best possible (1.0) and changing one of
    its numbers can improve it, so an improvement is within a 135M model's edits (unlike spread5)."""
    from reef_recipe_tttd import load_task

    task = load_task(ld.DiscoveryBench.task)
    [seed] = task.seeds()
    start = task.verify(seed).raw
    n = len(seed.split())
    assert start <= 0.1
    assert task.verify(" ".join(f"{i / (n - 1):g}" for i in range(n))).raw == pytest.approx(1.0)
    assert any(task.verify(e).raw > start + 1e-9 for e in _edits(task, seed, [i / 20 for i in range(21)]))


def test_floor_only_runs_search_only_alone_and_says_so():
    bench, seeds = ld.parse(["tttd", "--floor-only", "--budget", "64", "--seeds", "2"])
    assert bench.sides == ("search-only",) and seeds == [0, 1] and bench.samples == 64
    assert ld.parse(["tttd", "--seed", "1", "--seed", "0"])[1] == [1, 0]
    assert ld.parse(["tttd"])[0].sides == ld.MODES
    results = [ld.DiscoverySeed(0, {"search-only": _side([0.05, 0.1], [0.5, 0.25])}),
               ld.DiscoverySeed(1, {"search-only": _side([0.1, 0.2], [0.25, 0.25])})]
    assert ld.floor_summary("spread2", results, 64, 5.2) == (
        "tttd --floor-only on spread2: search-only best 0.150±0.071 at 64 samples (seeds: 0.1000, 0.2000), "
        "valid 38%→25%, 5.2 min")


def test_jobs_run_seeds_at_once_and_keep_their_order(monkeypatch):
    """``--jobs 2`` over 3 seeds: two run at once (a barrier only two concurrent seeds pass), never
    more than two, each seed's lines carry its seed and the results come back in the seeds' order."""
    import threading

    assert ld.parse(["tttd"])[0].jobs == 1 and ld.parse(["tttd", "--jobs", "3"])[0].jobs == 3
    with pytest.raises(SystemExit, match="--jobs"):
        ld.parse(["tttd", "--jobs", "0"])
    barrier, lock = threading.Barrier(2, timeout=30), threading.Lock()
    running, most = [0], [0]

    def fake_run_seed(bench, seed, runtime, workdir, log):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        if seed != 2:  # the first two seeds meet here, so they ran side by side
            barrier.wait()
        log(f"seed {seed} done")
        with lock:
            running[0] -= 1
        return ld.DiscoverySeed(seed, {"tttd": _side([0.1 * seed], [1.0])})

    monkeypatch.setattr(ld, "run_seed", fake_run_seed)
    lines: list[str] = []
    results = ld.run_seeds([2, 0, 1], 2, lambda seed, log: ld.run_seed(None, seed, None, None, log), lines.append)
    assert [r.seed for r in results] == [2, 0, 1]
    assert most[0] == 2
    assert sorted(lines) == ["[seed 0] seed 0 done", "[seed 1] seed 1 done", "[seed 2] seed 2 done"]
    # one job: the seeds one after another, their lines as before
    lines.clear()
    assert [r.seed for r in ld.run_seeds([2], 1, lambda seed, log: ld.run_seed(None, seed, None, None, log),
                                         lines.append)] == [2]
    assert lines == ["seed 2 done"]


def test_with_jobs_a_failed_seed_is_left_out_and_none_finishing_is_an_error():
    def run_one(seed, log):
        if seed == 1:
            raise RuntimeError("server did not start")
        return seed

    lines: list[str] = []
    assert ld.run_seeds([0, 1, 2], 2, run_one, lines.append) == [0, 2]
    assert "[seed 1] stopped: RuntimeError: server did not start" in lines
    with pytest.raises(SystemExit, match="no seed finished"):
        ld.run_seeds([1], 2, run_one, lines.append)


def test_an_interrupted_run_of_several_jobs_stops_every_live_server(monkeypatch):
    """SIGTERM raises SystemExit in the main thread while it waits on the seeds' daemon threads:
    ``on_abort`` runs before it goes on, and ``learning.stop_live_servers`` stops every server a
    ``serving`` block holds (an exiting interpreter would end the threads without their finally)."""
    import threading

    import learning

    release = threading.Event()
    calls: list[str] = []

    def run_one(seed, log):
        release.wait(30)
        return seed

    real_join = threading.Thread.join

    def interrupted_join(self, timeout=None):
        monkeypatch.setattr(threading.Thread, "join", real_join)
        raise SystemExit(143)

    monkeypatch.setattr(threading.Thread, "join", interrupted_join)
    with pytest.raises(SystemExit):
        ld.run_seeds([0, 1], 2, run_one, lambda line: None, on_abort=lambda: calls.append("abort"))
    release.set()
    assert calls == ["abort"]

    class FakeServer:
        def __init__(self, name):
            self.name, self.stopped = name, 0

        def start(self):
            pass

        def wait_ready(self):
            pass

        def stop(self):
            self.stopped += 1

    a, b = FakeServer("a"), FakeServer("b")
    with learning.serving([a, b]):
        learning.stop_live_servers()  # what on_abort does while a seed is still serving
        assert (a.stopped, b.stopped) == (1, 1)
    assert (a.stopped, b.stopped) == (2, 2)  # the block's own finally (stop is idempotent on a real server)
    learning.stop_live_servers()
    assert (a.stopped, b.stopped) == (2, 2)  # left the block: no longer live
