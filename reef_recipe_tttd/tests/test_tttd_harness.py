"""The search harness against a real Reef (the tiny model served by runtime=local, recipe=tttd),
its archive's pending → committed life and identity checks, and Guidance-TTT with a scripted client."""

from __future__ import annotations

import itertools
import json

import pytest

from reef_core.testing import ReefServer
from reef_recipe_tttd import GuidanceAttempt, SearchHarness, SearchSettings, StepAborted, keyword_executor
from reef_recipe_tttd.client import ReefClient, Sampled
from reef_recipe_tttd.persist import IdentityMismatch
from reef_recipe_tttd.tasks import Task, Verdict, load_task

#: a test double whose every answer scores differently: the tiny model's grids always carry a
#: learning signal (a step with none proposes nothing, so it would make no release)
CHECKSUM = "reef_recipe_tttd.testing:ChecksumTask"


def _server(tmp_path, model_dir, *extra):
    return ReefServer(tmp_path / "state", ["runtime=local", f"runtime.model={model_dir}", "recipe=tttd",
                                           "recipe.groups_per_step=2", "recipe.rollouts_per_group=2",
                                           "recipe.lora_rank=4", "recipe.lora_alpha=8", "recipe.lora_lm_head=true",
                                           "evaluator=always", "server.default_scenario=disc", *extra])


def test_two_steps_against_a_real_server(tmp_path, tiny_model_dir):
    with _server(tmp_path, tiny_model_dir) as reef:
        client = ReefClient(reef.url, scenario="disc")
        settings = SearchSettings(groups=2, rollouts=2, max_tokens=6, wait_timeout_s=120, concurrency=4)
        harness = SearchHarness(load_task(CHECKSUM), client, tmp_path / "run", settings)
        history = harness.run(2)
        assert [h["step"] for h in history] == [0, 1]
        # each step's grid became a release that serves before the archive committed
        releases = [h["committed_release"] for h in history]
        assert all(releases) and releases[0] != releases[1]
        assert reef.store.head_release("disc").release_id == releases[1]
        assert history[1]["release_id"] == releases[0]  # step 1 was sampled from step 0's release
        saved = json.loads((tmp_path / "run" / "archive.json").read_text())
        assert saved["status"] == "committed" and saved["step"] == 1
        assert not (tmp_path / "run" / "archive.pending.json").exists()
        reports = reef.store.list_reports("disc", limit=100)
        meta = [r.meta for r in reports]
        assert len(meta) == 8 and {m["comparison_set"] for m in meta} >= {"tttd-step-1-group-0", "tttd-step-1-group-1"}
        assert all({"step", "group", "rollout", "groups_per_step", "rollouts_per_group", "archive_best"} <= set(m)
                   for m in meta)
        # 8 rollouts, 8 visits (plus the seed's own)
        assert harness.archive.total == 8
        # resuming with another grid is refused
        with pytest.raises(IdentityMismatch, match="groups"):
            SearchHarness(load_task(CHECKSUM), client, tmp_path / "run",
                          SearchSettings(groups=1, rollouts=2, max_tokens=6))
        # resuming with the same settings continues at step 2
        again = SearchHarness(load_task(CHECKSUM), client, tmp_path / "run", settings)
        assert again.next_step == 2 and again.settings.run == harness.settings.run
        client.close()


class ScriptedClient:
    """Answers from a list of guide replies; records what was reported."""

    model = "guide"

    def __init__(self, replies):
        self.replies = itertools.cycle(replies)
        self.reports = []
        self.prompts = []
        self.n = 0

    def sample(self, messages, **kw):
        self.n += 1
        self.prompts.append(messages)
        return Sampled(f"rec{self.n}", next(self.replies), "rel1")

    def report(self, receipt, score, metadata, report_id=None):
        self.reports.append((receipt, score, metadata))

    def candidates(self, limit=50):
        return [{"id": f"c{len(self.reports)}", "status": "skipped"}] if self.reports else []

    def scenario_state(self):
        return {"serving_release_id": "rel1"}


def test_guidance_malformed_scores_zero_without_the_executor(tmp_path):
    calls = []

    def executor(task, parent, guidance):
        calls.append(guidance)
        return keyword_executor(task, parent, guidance)

    client = ScriptedClient(["no block here", "<guidance>spread even</guidance>", "<guidance></guidance>",
                             "<guidance>grow</guidance> trailing", "<guidance>even</guidance>"])
    attempt = GuidanceAttempt(load_task("spread5"), executor)
    harness = SearchHarness(load_task("spread5"), client, tmp_path / "g",
                            SearchSettings(groups=1, rollouts=5, concurrency=1, poll_s=0.01, wait_timeout_s=5),
                            attempt=attempt)
    harness.step()
    scores = {m["rollout"]: (s, m["valid"]) for _, s, m in client.reports}
    assert [scores[i][0] for i in (0, 2, 3)] == [0.0, 0.0, 0.0]
    assert scores[1][0] > 0 and scores[1][1] and scores[4][0] > 0
    assert calls == ["spread even", "even"]  # malformed guidance never reached the executor
    assert harness.archive.total == 5  # ...but every rollout was a visit
    # only the guide's receipts are reported (the executor never went through Reef)
    assert [r for r, _, _ in client.reports] == [f"rec{i}" for i in range(1, 6)]
    assert all(m["mode"] == "guidance" for _, _, m in client.reports)


def test_an_executor_error_stops_the_step(tmp_path):
    def broken(task, parent, guidance):
        raise ConnectionError("executor down")

    client = ScriptedClient(["<guidance>grow</guidance>"])
    harness = SearchHarness(load_task("circles3"), client, tmp_path / "g",
                            SearchSettings(groups=1, rollouts=2, concurrency=1),
                            attempt=GuidanceAttempt(load_task("circles3"), broken))
    with pytest.raises(StepAborted, match="executor down"):
        harness.step()
    assert client.reports == [] and harness.next_step == 0
    assert not (tmp_path / "g" / "archive.pending.json").exists()
    # a reply without a solution is an executor error too, not a zero
    attempt = GuidanceAttempt(load_task("circles3"), lambda t, p, g: "I cannot")
    with pytest.raises(StepAborted, match="no <solution>"):
        attempt.judge(harness.archive.nodes["n1"], "<guidance>grow</guidance>")


class Scaled(Task):
    """Trains on a bounded reward, ranks the archive by the raw metric."""

    name = "scaled"

    @property
    def instruction(self):
        return "write a number"

    def verify(self, output):
        raw = float(output)
        return Verdict(score=min(raw / 1000.0, 1.0), raw=raw, valid=True, message="ok")


def test_raw_metric_ranks_the_archive_and_the_score_trains(tmp_path):
    values = iter(["5000", "200"])
    client = ScriptedClient(["<guidance>a</guidance>"])
    attempt = GuidanceAttempt(Scaled(), lambda t, p, g: f"<solution>{next(values)}</solution><summary>s</summary>")
    harness = SearchHarness(Scaled(), client, tmp_path / "g", SearchSettings(groups=1, rollouts=2, concurrency=1,
                                                                             poll_s=0.01), attempt=attempt)
    harness.step()
    assert sorted(s for _, s, _ in client.reports) == [0.2, 1.0]  # training rewards, bounded
    assert harness.best().value == 5000.0 and harness.best().reward == 1.0
    assert sorted(m["raw_score"] for _, _, m in client.reports) == [200.0, 5000.0]


def test_a_judge_error_stops_the_step(tmp_path):
    def bad_judge(solution):
        raise ValueError("judge missing")

    attempt = GuidanceAttempt(load_task("spread5"), keyword_executor, judge=bad_judge)
    client = ScriptedClient(["<guidance>even</guidance>"])
    harness = SearchHarness(load_task("spread5"), client, tmp_path / "g", SearchSettings(groups=1, rollouts=2),
                            attempt=attempt)
    with pytest.raises(StepAborted, match="judge missing"):
        harness.step()
    assert client.reports == []
