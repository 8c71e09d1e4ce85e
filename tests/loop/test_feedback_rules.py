"""The feedback_rules recipe: rules from feedback, normalised, deduplicated, capped; the
proposer model and its fallback."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from reef_core.builtins.feedback_rules import (
    FeedbackRulesRecipe,
    normalize_rule,
    parse_rules,
    rule_key,
)
from reef_core.grow.context import RecipeContext
from reef_core.grow.progress import LogProgress
from reef_core.observe import Batch, Experience, ExperienceRecord
from reef_core.testing import FakeUpstream, last_user_text, system_prompt
from reef_core.types import ActiveRelease


def _exp(feedback, score=0.0, question="What is 2+2?"):
    rec = ExperienceRecord(id="rec_1", scenario="s", session=None, release_id=None, created_at=None, status="ok",
                           model="m", route="openai.chat",
                           request={"messages": [{"role": "user", "content": question}]}, response=None)
    return Experience(report_id=f"rpt_{feedback}", scenario="s", score=score, feedback=feedback, metadata={},
                      created_at=None, records=(rec,))


def _args(tmp_path: Path, current: Path) -> tuple[ActiveRelease | None, RecipeContext]:
    """``propose``'s second and third arguments: the serving release at ``current``, and a context."""
    ctx = _ctx(tmp_path, current)
    return ctx.current, ctx


def _ctx(tmp_path: Path, current: Path | None = None) -> RecipeContext:
    scratch = tmp_path / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    release = ActiveRelease(scenario="s", release_id="rel_1", path=current) if current else None
    return RecipeContext(scenario="s", recipe="feedback_rules", runtime=None, store=None, scratch_dir=scratch,
                         progress=LogProgress(logging.getLogger("t")), log=logging.getLogger("t"),
                         current=release, settings=None, _model=None)


def test_normalise_and_compare_rules():
    assert normalize_rule("  - always   cite sources  ", 240) == "Always cite sources."
    assert normalize_rule('"Be brief!"', 240) == "Be brief!"
    assert normalize_rule("1. use metric units", 240) == "Use metric units."
    assert normalize_rule("x" * 300, 50).endswith("…") and len(normalize_rule("x" * 300, 50)) == 50
    # the bound holds after the full stop and the capital; control characters never reach the prompt
    assert all(len(normalize_rule(t, 20)) <= 20 for t in ("x" * 20, "ß" * 20, "ﬃ" + "y" * 19))
    assert normalize_rule("hello\x00world\x1b[31m red", 240) == "Hello world [31m red."
    assert normalize_rule("   ", 240) == ""
    assert rule_key("Always cite sources.") == rule_key("always, CITE sources!")
    assert parse_rules("# Rules\nKeep this intro.\n\n- one\n* two\n3) three\n") == (
        "Keep this intro.", ["one", "two", "three"])


def test_adds_new_rules_and_keeps_existing_ones(tmp_path):
    current = tmp_path / "current"
    (current / "harness").mkdir(parents=True)
    (current / "harness" / "rules.md").write_text("House style first.\n\n- Cite sources.\n")
    (current / "harness" / "system.md").write_text("You help.\n")
    batch = Batch("s", [_exp("cite SOURCES"), _exp("use metric units"), _exp({"comment": "Use metric units"}),
                        _exp(None)])
    candidate = FeedbackRulesRecipe().propose(batch, *_args(tmp_path, current))
    rules = (candidate.artifact_dir / "harness" / "rules.md").read_text()
    assert rules == "House style first.\n\n- Cite sources.\n- Use metric units.\n"
    assert (candidate.artifact_dir / "harness" / "system.md").read_text() == "You help.\n"
    assert candidate.metadata["added_rules"] == ["Use metric units."]
    assert (current / "harness" / "rules.md").read_text() == "House style first.\n\n- Cite sources.\n"


def test_nothing_new_proposes_nothing(tmp_path):
    recipe = FeedbackRulesRecipe()
    assert recipe.propose(Batch("s", [_exp(None), _exp("  ")]), None, _ctx(tmp_path)) is None
    current = tmp_path / "c"
    (current / "harness").mkdir(parents=True)
    (current / "harness" / "rules.md").write_text("- Be brief.\n")
    assert recipe.propose(Batch("s", [_exp("be brief")]), *_args(tmp_path, current)) is None


def test_rule_cap_keeps_existing_rules(tmp_path):
    current = tmp_path / "c"
    (current / "harness").mkdir(parents=True)
    (current / "harness" / "rules.md").write_text("- One.\n- Two.\n")
    recipe = FeedbackRulesRecipe(max_rules=3)
    candidate = recipe.propose(Batch("s", [_exp("three"), _exp("four")]), *_args(tmp_path, current))
    assert (candidate.artifact_dir / "harness" / "rules.md").read_text() == "- One.\n- Two.\n- Three.\n"


def test_options_are_checked():
    with pytest.raises(ValueError, match="batch_size"):
        FeedbackRulesRecipe(batch_size=0)
    with pytest.raises(ValueError, match="proposer"):
        FeedbackRulesRecipe(proposer="gpt")
    with pytest.raises(ValueError, match="url"):
        FeedbackRulesRecipe(proposer={"model": "x"})
    assert FeedbackRulesRecipe(max_score=None).filters == ["scored"]
    assert FeedbackRulesRecipe(max_score=0.3).filters == ["scored", ("score_window", {"max": 0.3})]


def test_proposer_rewrites_feedback_and_falls_back_on_error(tmp_path):
    def proposer(body):
        assert "ONE short, general rule" in system_prompt(body)
        assert "Request: What is 2+2?" in last_user_text(body)
        return "Show the arithmetic step by step\nextra line ignored"

    with FakeUpstream("openai", proposer, api_key="k") as up:
        recipe = FeedbackRulesRecipe(proposer={"url": f"{up.url}/v1", "model": "rewriter", "api_key": "k"})
        candidate = recipe.propose(Batch("s", [_exp("wrong, you didn't show work!!")]), None, _ctx(tmp_path))
        assert candidate.metadata["added_rules"] == ["Show the arithmetic step by step."]
        assert up.requests[0]["model"] == "rewriter"

        up.fail(500, "overloaded")
        fallback = recipe.propose(Batch("s", [_exp("explain units")]), None, _ctx(tmp_path / "x"))
        assert fallback.metadata["added_rules"] == ["Explain units."]


def test_proposer_url_credentials_go_as_basic_auth_and_never_into_the_log(tmp_path, caplog):
    import base64

    with FakeUpstream("openai", lambda body: "Answer briefly") as up:
        url = up.url.replace("http://", "http://bot:s3cret@") + "/v1"
        recipe = FeedbackRulesRecipe(proposer={"url": url, "model": "rewriter"})
        recipe.propose(Batch("s", [_exp("too long")]), None, _ctx(tmp_path))
        assert up.headers[-1]["authorization"] == "Basic " + base64.b64encode(b"bot:s3cret").decode()
        up.fail(500, "overloaded")
        with caplog.at_level(logging.DEBUG):
            recipe.propose(Batch("s", [_exp("be precise")]), None, _ctx(tmp_path / "x"))
        assert "proposer failed" in caplog.text and "s3cret" not in caplog.text
