"""An example Reef recipe plugin: keep the best-scored answers as few-shot examples.

When users score answers highly, this recipe copies those question/answer pairs into the
scenario's harness system prompt (a section it owns), so later requests see worked examples
of what "good" looks like. It is small on purpose: it shows every part a recipe plugin has —
the entry point, a registered recipe class, a config group file, and tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from reef_core import ActiveRelease, Batch, Candidate, Recipe, RecipeContext, hookimpl, refuse_bad_options

BEGIN = "<!-- few-shot examples: maintained by the few_shot recipe -->"
END = "<!-- end few-shot examples -->"


class FewShotRecipe(Recipe):
    """Adds highly scored exchanges to ``harness/system.md`` as examples (newest first, capped)."""

    update_target = "harness"
    filters = ("scored",)
    default_evaluator = "always"

    def __init__(self, min_score: float = 0.8, max_examples: int = 4, batch_size: int = 2,
                 max_chars: int = 600):
        refuse_bad_options(type(self), locals())
        self.min_score = float(min_score)
        self.max_examples = int(max_examples)
        self.batch_size = int(batch_size)
        self.max_chars = int(max_chars)

    @classmethod
    def option_problems(cls, o: dict[str, Any]) -> list[str]:
        """What the annotations cannot say; ``reef config`` asks it before anything is built."""
        problems = []
        if o["max_examples"] < 1:
            problems.append("max_examples must be at least 1")
        if o["batch_size"] < 1 or o["max_chars"] < 1:
            problems.append("batch_size and max_chars must be at least 1")
        return problems

    def propose(self, batch: Batch, current: ActiveRelease | None, ctx: RecipeContext) -> Candidate | None:
        new = []
        for exp in batch:
            if exp.score is None or exp.score < self.min_score:
                continue
            for rec in exp.records:
                question = last_user_text(rec.request)
                answer = rec.response_text()
                if question and answer:
                    new.append((question[: self.max_chars], answer[: self.max_chars]))
        if not new:
            return None
        artifact = ctx.new_artifact()
        system = artifact / "harness" / "system.md"
        text = system.read_text() if system.exists() else ""
        before, examples, after = split_section(text)
        merged = list(dict.fromkeys(new + examples))[: self.max_examples]
        if merged == examples:
            return None
        system.parent.mkdir(parents=True, exist_ok=True)
        system.write_text(join_section(before, merged, after))
        return Candidate(
            scenario=ctx.scenario,
            recipe=ctx.recipe,
            artifact_dir=artifact,
            base_release_id=current.release_id if current else None,
            summary=f"{len(merged)} few-shot example(s), {len(set(new) - set(examples))} new",
        )


def last_user_text(request: dict[str, Any] | None) -> str:
    """The text of the last user message of an OpenAI or Anthropic request body."""
    for msg in reversed((request or {}).get("messages") or []):
        if msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            return content.strip()
        if isinstance(content, list):
            return " ".join(p.get("text", "") for p in content if isinstance(p, dict)).strip()
    return ""


def split_section(text: str) -> tuple[str, list[tuple[str, str]], str]:
    """(text before, examples, text after) of the recipe's section in a system prompt."""
    if BEGIN not in text or END not in text:
        return text.rstrip(), [], ""
    before, rest = text.split(BEGIN, 1)
    body, after = rest.split(END, 1)
    examples = []
    for block in body.split("\n### Example\n")[1:]:
        q, _, a = block.partition("\nAnswer:\n")
        examples.append((q.removeprefix("Question:\n").strip(), a.strip()))
    return before.rstrip(), examples, after.strip()


def join_section(before: str, examples: list[tuple[str, str]], after: str) -> str:
    blocks = "".join(f"\n### Example\nQuestion:\n{q}\nAnswer:\n{a}\n" for q, a in examples)
    parts = [before, f"{BEGIN}\nAnswers users rated highly:\n{blocks}{END}", after]
    return "\n\n".join(p for p in parts if p) + "\n"


@hookimpl
def register_recipes(register):
    register("few_shot", FewShotRecipe)


@hookimpl
def reef_config_dir():
    return os.fspath(Path(__file__).with_name("conf"))
