"""Tests a recipe author writes: the recipe's logic on hand-made experience, no server needed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from reef_core import Batch, Experience, ExperienceRecord, option_problems
from reef_recipe_few_shot import BEGIN, FewShotRecipe, split_section


def _record(i: int, question: str, answer: str) -> ExperienceRecord:
    return ExperienceRecord(
        id=f"r{i}", scenario="s", session=None, release_id=None, created_at=None, status="ok",
        model="m", route="chat", request={"messages": [{"role": "user", "content": question}]},
        response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
    )


def _batch(*items: tuple[float, str, str]) -> Batch:
    return Batch("s", [
        Experience(report_id=f"rep{i}", scenario="s", score=score, feedback=None, metadata={},
                   created_at=None, records=(_record(i, q, a),))
        for i, (score, q, a) in enumerate(items)
    ])


class Ctx(SimpleNamespace):
    """The slice of the loop's RecipeContext this recipe uses."""

    def new_artifact(self) -> Path:
        dest = self.scratch_dir / "artifact"
        if self.current_dir is not None:
            import shutil

            shutil.copytree(self.current_dir, dest)
        else:
            dest.mkdir()
        return dest


def test_keeps_only_well_scored_answers(tmp_path):
    ctx = Ctx(scenario="s", recipe="few_shot", scratch_dir=tmp_path, current_dir=None)
    cand = FewShotRecipe(min_score=0.8).propose(
        _batch((1.0, "2+2?", "4"), (0.1, "capital of France?", "Berlin")), None, ctx)
    text = (cand.artifact_dir / "harness" / "system.md").read_text()
    assert BEGIN in text and "2+2?" in text and "Berlin" not in text
    assert cand.summary == "1 few-shot example(s), 1 new"


def test_nothing_to_learn_proposes_nothing(tmp_path):
    ctx = Ctx(scenario="s", recipe="few_shot", scratch_dir=tmp_path, current_dir=None)
    assert FewShotRecipe().propose(_batch((0.2, "q", "a")), None, ctx) is None


def test_merges_with_existing_prompt_and_caps(tmp_path):
    current = tmp_path / "current"
    (current / "harness").mkdir(parents=True)
    (current / "harness" / "system.md").write_text("You are terse.\n")
    ctx = Ctx(scenario="s", recipe="few_shot", scratch_dir=tmp_path / "scratch", current_dir=current)
    ctx.scratch_dir.mkdir()
    recipe = FewShotRecipe(max_examples=2)
    first = recipe.propose(_batch((0.9, "q1", "a1"), (0.9, "q2", "a2"), (0.95, "q3", "a3")), None, ctx)
    text = (first.artifact_dir / "harness" / "system.md").read_text()
    before, examples, _ = split_section(text)
    assert before == "You are terse." and examples == [("q1", "a1"), ("q2", "a2")]


def test_option_values_are_checked_before_the_recipe_is_built():
    assert option_problems(FewShotRecipe, {"min_score": 0.8, "max_examples": 0, "batch_size": 2,
                                           "max_chars": 600}) == ["max_examples must be at least 1"]
    with pytest.raises(ValueError, match="^max_examples must be at least 1$"):
        FewShotRecipe(max_examples=0)
