"""``reef demo``: its pieces that need no model, and ``reef demo --quick`` end to end on the
embedded SmolLM2 (slow): a release is published and the simulated users' score rises."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from rich.console import Console

from reef_core.cli import main
from reef_core.demo.plot import learning_curve
from reef_core.demo.preference import PREFERENCE
from reef_core.demo.questions import QUESTIONS, deal
from reef_core.demo.run import DemoResult, Plan, recipe_config, server_config, summary_panel


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


def test_unknown_recipe_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["demo", "--recipe", "no_such_recipe", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "not an installed recipe" in result.output and "feedback_rules" in result.output


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
