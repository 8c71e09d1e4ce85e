"""``reef demo``: its pieces that need no model, and ``reef demo --quick`` end to end on the
embedded SmolLM2 (slow): a release is published and the simulated users' score rises."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from reef_core.cli import main
from reef_core.demo.plot import draw_curve, learning_curve
from reef_core.demo.preference import PREFERENCE
from reef_core.demo.progress import LineProgress, LiveProgress, Turn, demo_progress
from reef_core.demo.questions import QUESTIONS, deal
from reef_core.demo.run import (
    DemoResult,
    Plan,
    published_releases,
    recipe_config,
    run_demo,
    server_config,
    summary_panel,
)


def test_questions_are_dealt_disjoint():
    qs = deal(heldout=16, gate=12, traffic=100)
    assert len(qs.heldout) == 16 and len(qs.gate) == 12 and len(qs.traffic) == 100
    assert not set(qs.heldout) & set(qs.gate)
    assert not (set(qs.heldout) | set(qs.gate)) & set(qs.traffic)
    with pytest.raises(ValueError):
        deal(heldout=len(QUESTIONS), gate=0, traffic=1)


def test_grader_and_gate_pattern_agree():
    import re

    for answer in PREFERENCE.examples_met:
        assert PREFERENCE.grade(answer) == 1.0
        assert re.search(PREFERENCE.pattern, answer, re.S)
    for answer in PREFERENCE.examples_missed:
        assert PREFERENCE.grade(answer) == 0.0
        assert not re.search(PREFERENCE.pattern, answer, re.S)


def test_server_config_gates_on_the_preference():
    plan = Plan.choose(True, None)
    cfg = server_config("feedback_rules", plan, PREFERENCE, ["What is the capital of Peru?"])
    assert cfg["recipe"] == {"name": "feedback_rules", "batch_size": plan.users, "max_score": 0.5, "proposer": None}
    assert cfg["evaluator"]["tasks"] == [{"id": "gate-0", "prompt": "What is the capital of Peru?",
                                          "pattern": PREFERENCE.pattern}]
    assert recipe_config("sao", plan) == {"name": "sao"}


def _result(**kw) -> DemoResult:
    base = dict(recipe="feedback_rules", preference=PREFERENCE.description, users=3, reports=12, before=0.5,
                after=0.875, published=1, rejected=0, other_candidates={"skipped": 1},
                learnt=["add 1 rule(s): Keep answers to one short sentence."],
                curve=[{"round": 1, "reports": 3, "score": 0.33, "published": 0, "serving": None},
                       {"round": 2, "reports": 6, "score": 1.0, "published": 1, "serving": "rel_1"}],
                settled=True, seconds=90.0, dashboard="http://127.0.0.1:1234/ui")
    return DemoResult(**{**base, **kw})


def _text(panel) -> str:
    console = Console(width=200, record=True)
    console.print(panel)
    return console.export_text()


def test_summary_says_what_happened_plainly():
    text = _text(summary_panel(_result()))
    assert "before 0.50 → after 0.88" in text and "published: 1" in text and "skipped: 1" in text
    assert "follows the preference" in text and "--keep-serving" in text
    assert "did not rise" in _text(summary_panel(_result(after=0.5)))
    nothing = _text(summary_panel(_result(published=0, learnt=[], after=0.5), serving=True))
    assert "Nothing was published" in nothing and "--keep-serving" not in nothing
    assert "had not settled" in _text(summary_panel(_result(settled=False)))


def test_learning_curve_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = learning_curve(_result(), tmp_path / "curve.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _release_marks(fig) -> tuple[list[float], list[tuple[str, float]]]:
    """(x of each vertical release line, (text, x) of each release label) of the curve's axes."""
    [ax] = fig.axes
    lines = [ln.get_xdata()[0] for ln in ax.get_lines() if (ln.get_gid() or "").startswith("release-")]
    labels = [(t.get_text(), t.xy[0]) for t in ax.texts if (t.get_gid() or "").startswith("release-")]
    return lines, labels


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=40), max_size=4))
def test_the_curve_marks_each_published_release_with_a_line_and_a_label(at):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    releases = [{"release_id": f"rel_{i}", "reports": x, "summary": "add 1 rule(s)"} for i, x in enumerate(at)]
    fig = draw_curve(_result(releases=releases))
    try:
        lines, labels = _release_marks(fig)
        assert lines == at
        assert labels == [(f"release {i} published", x) for i, x in enumerate(at, start=1)]
    finally:
        plt.close(fig)


def test_a_release_is_placed_at_the_reports_sent_before_it_was_decided():
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    posted = [(t0, 0), (t0 + timedelta(seconds=10), 3), (t0 + timedelta(seconds=20), 6)]

    def cand(status, seconds, rid):
        return {"status": status, "release_id": rid, "summary": rid,
                "decided_at": (t0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")}

    candidates = [cand("published", 25, "rel_b"), cand("rejected", 12, None), cand("published", 15, "rel_a"),
                  {"status": "evaluating", "release_id": None, "decided_at": None}]
    assert [(r["release_id"], r["reports"]) for r in published_releases(candidates, posted)] == \
        [("rel_a", 3), ("rel_b", 6)]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_off_a_terminal_is_plain_lines_one_per_phase_round_and_decided_candidate():
    stream, clock = io.StringIO(), _Clock()
    progress = demo_progress(Console(file=stream))
    assert isinstance(progress, LineProgress)
    progress.clock, progress.start = clock, clock.now
    with progress:
        boot = progress.phase("starting reef serve", total=1)
        progress.finish(boot)
        clock.now += 12
        traffic = progress.phase("users ask, grade and report", total=4)
        for _ in range(4):
            progress.advance(traffic)  # steps are not lines
        progress.round_done(1, 2, [Turn("user-1", "q", "a", 1.0, None), Turn("user-2", "q", "a", 0.0, None)])
        proposed = {"id": "cand_1", "status": "evaluating", "created_at": "2026-01-01T00:00:01"}
        progress.observe({"state": "growing"}, [proposed])
        published = {**proposed, "status": "published", "release_id": "rel_1", "summary": "add 1 rule(s): be brief"}
        rejected = {"id": "cand_2", "status": "rejected", "created_at": "2026-01-01T00:00:02",
                    "reason": "gate: 0.25 < 0.5", "summary": "add 1 rule(s): shout"}
        skipped = {"id": "cand_3", "status": "skipped", "created_at": "2026-01-01T00:00:03"}
        undecided = {"id": "cand_4", "status": "undecided", "created_at": "2026-01-01T00:00:04",
                     "reason": "no decision within 96 episodes"}
        progress.observe({"state": "idle"}, [rejected, published, skipped, undecided])
        progress.observe({"state": "idle"}, [rejected, published, skipped, undecided])  # each is told once
        progress.phase("learning settles")
    assert stream.getvalue().splitlines() == [
        "[    0s] starting reef serve (1) …",
        "[   12s] users ask, grade and report (4) …",
        "[   12s] round 1/2: 2 answers graded and reported, mean score 0.50",
        "[   12s] candidate cand_1 published as rel_1: add 1 rule(s): be brief",
        "[   12s] candidate cand_2 rejected: gate: 0.25 < 0.5",
        "[   12s] candidate cand_4 undecided: no decision within 96 episodes",
        "[   12s] learning settles …",
    ]
    assert progress.counts == {"published": 1, "rejected": 1, "skipped": 1, "undecided": 1}
    assert "\x1b" not in stream.getvalue()  # no terminal control codes in a log


class _ScriptedServer:
    """What ``run_demo`` uses of ``DemoServer``, without a model: every other answer follows the
    preference, and one candidate is published after the second round."""

    url, log_path = "http://127.0.0.1:1", "serve.log"

    def __init__(self, *args, **kwargs) -> None:
        self.reports = 0

    def start(self) -> None:
        pass

    def wait_ready(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def log_tail(self) -> str:
        return ""

    def ask(self, question, *, max_tokens, tag):
        return f"rec_{question}", (PREFERENCE.examples_met[0] if len(question) % 2 else "A long answer. " * 5), None

    def report(self, receipt, score, feedback, user) -> None:
        self.reports += 1

    def loop_state(self):
        return {"state": "idle", "eligible": 0, "batch_size": 3}

    def candidates(self):
        if self.reports < 6:
            return []
        return [{"id": "cand_1", "status": "published", "release_id": "rel_1", "summary": "add 1 rule(s)",
                 "created_at": "2026-01-01T00:00:00"}]

    def settled(self) -> bool:
        return True


def test_the_demo_run_off_a_terminal_prints_its_progress_as_it_goes(tmp_path, monkeypatch):
    monkeypatch.setattr("reef_core.demo.run.DemoServer", _ScriptedServer)
    monkeypatch.setattr("reef_core.demo.run.time.sleep", lambda s: None)
    stream = io.StringIO()
    plan = Plan(users=3, rounds=3, heldout=2, gate=2, settle_timeout_s=60)
    result, _ = run_demo(recipe="feedback_rules", plan=plan, port=1, out=tmp_path, console=Console(file=stream))
    lines = [line.split("] ", 1)[1] for line in stream.getvalue().splitlines()]
    assert lines == [
        "starting reef serve (SmolLM2-135M-Instruct) (1) …",
        "held-out questions, before (2) …",
        "users ask, grade and report (9) …",
        *[line for line in lines if line.startswith("round 1/3")],
        *[line for line in lines if line.startswith("round 2/3")],
        "candidate cand_1 published as rel_1: add 1 rule(s)",
        *[line for line in lines if line.startswith("round 3/3")],
        "learning settles (candidates gated, winners published) …",
        "held-out questions, after (2) …",
    ]
    assert all(len([x for x in lines if x.startswith(f"round {n}/3")]) == 1 for n in (1, 2, 3))
    assert result.published == 1 and result.reports == 9


def test_progress_on_a_terminal_is_the_live_table():
    stream = io.StringIO()
    progress = demo_progress(Console(file=stream, force_terminal=True, width=120))
    assert isinstance(progress, LiveProgress)
    with progress:
        phase = progress.phase("held-out questions, before", total=2)
        progress.advance(phase)
        progress.round_done(1, 1, [Turn("user-1", "What is 2+2?", "Four.", 1.0, None)])
        progress.observe({"state": "idle", "eligible": 0}, [{"id": "c", "status": "published"}])
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())  # the terminal's styles and cursor moves
    assert "latest answers" in text and "What is 2+2?" in text and "1 published" in text


def test_unknown_recipe_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["demo", "--recipe", "no_such_recipe", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "not an installed recipe" in result.output and "feedback_rules" in result.output


@pytest.mark.slow  # the embedded model learning for real: 83-381 s of one worker on 2 busy cores
def test_demo_quick_publishes_and_the_score_rises(tmp_path):
    pytest.importorskip("reef_torch")
    pytest.importorskip("matplotlib")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "120"}
    run = subprocess.run([sys.executable, "-m", "reef_core", "demo", "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=1800)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["published"] >= 1, run.stdout[-4000:]
    assert summary["after"] > summary["before"], run.stdout[-4000:]
    assert summary["learnt"], summary
    png = tmp_path / "learning-curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "dashboard: http://127.0.0.1:" in run.stdout and "/ui" in run.stdout
    assert f"after={summary['after']:.3f}" in run.stdout
