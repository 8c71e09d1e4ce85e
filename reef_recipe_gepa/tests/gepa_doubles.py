"""Test doubles for the gepa recipe: a task model whose answers depend on one keyword of the
harness, a scripted reflection model (and judge), and contexts that need no server."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from reef_core import ActiveRelease, Batch, Experience, ExperienceRecord, RecipeContext
from reef_core.testing import EchoRuntime, reef_settings

KEYWORD = "XYZZY"
LESSON = f"Always answer with the magic word {KEYWORD}."
QUESTIONS = ["What is the magic word?", "Tell me the password.", "Say the secret.", "Which word opens the door?"]
TASKS = [{"id": f"t{i}", "prompt": f"Validation {q}", "expected": KEYWORD} for i, q in enumerate(QUESTIONS)]


def harness_text(release: ActiveRelease | None) -> str:
    harness = release.harness_dir if release is not None else None
    if harness is None:
        return ""
    return "\n".join(p.read_text() for p in sorted(harness.rglob("*.md")))


def keyword_answer(harness: str, question: str) -> str:
    """The toy task: correct exactly when the harness holds the keyword."""
    return f"The word is {KEYWORD}." if KEYWORD in harness else f"I cannot say ({question[:20]})."


class KeywordTaskModel:
    """What ``RecipeContext.complete`` calls: answers from the release's harness; counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, body: dict[str, Any], release: ActiveRelease | None, *, timeout_s: float | None = None):
        self.calls += 1
        question = str(body["messages"][-1]["content"])
        text = keyword_answer(harness_text(release), question)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


class ScriptedReflection:
    """The reflection model and judge: proposes the lesson once the feedback it reads names the
    keyword; judges an answer 1 when it holds the keyword. Records every prompt."""

    def __init__(self, proposal: str = LESSON) -> None:
        self.proposal = proposal
        self.prompts: list[str] = []

    def __call__(self, prompt: Any) -> str:
        text = prompt if isinstance(prompt, str) else str(prompt)
        self.prompts.append(text)
        if text.startswith("You grade"):
            answer = text.rsplit("The new answer:", 1)[1]
            return "1\nit names the word" if KEYWORD in answer else "0\nit does not name the word"
        if KEYWORD in text:
            return f"Here is the new instruction:\n```\n{self.proposal}\n```"
        return "```\nAnswer carefully.\n```"


class WordsTaskModel:
    """A task model for merge: the answer names every word of ``words`` the release's harness
    holds, in any component, so two components can each teach part of the validation set."""

    def __init__(self, words: tuple[str, ...]) -> None:
        self.words = words
        self.calls = 0

    def complete(self, body: dict[str, Any], release: ActiveRelease | None, *, timeout_s: float | None = None):
        self.calls += 1
        harness = harness_text(release)
        text = "I say " + (" ".join(w for w in self.words if w in harness) or "nothing") + "."
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


class RewritingReflection:
    """A reflection model that rewrites a component's current text by a fixed table (anything
    else becomes a harmless instruction). Records every prompt."""

    def __init__(self, rewrites: dict[str, str]) -> None:
        self.rewrites = rewrites
        self.prompts: list[str] = []

    def __call__(self, prompt: Any) -> str:
        text = prompt if isinstance(prompt, str) else str(prompt)
        self.prompts.append(text)
        current = text.split("```\n", 1)[1].split("\n```", 1)[0].strip()  # GEPA quotes the current text first
        return f"```\n{self.rewrites.get(current, 'Answer carefully.')}\n```"


def settings_with_tasks(state_dir: Path, tasks: list[dict[str, Any]] | None = TASKS, evaluator: str = "task_suite"):
    config = Path(state_dir).parent / f"{Path(state_dir).name}-reef.yaml"
    data: dict[str, Any] = {"recipe": {"name": "gepa"}, "evaluator": {"name": evaluator}}
    if tasks is not None:
        data["evaluator"]["tasks"] = tasks
    config.write_text(yaml.safe_dump(data))
    return reef_settings(state_dir, config_file=config)


def context(scratch: Path, current: ActiveRelease | None, settings: Any, model: Any = None,
            scenario: str = "default") -> RecipeContext:
    scratch.mkdir(parents=True, exist_ok=True)
    log = logging.getLogger("reef.test.gepa")
    from reef_core.testing import recipe_context

    base = recipe_context(scratch, current, recipe="gepa", settings=settings)
    return RecipeContext(scenario=scenario, recipe="gepa", runtime=base.runtime if base else EchoRuntime(),
                         store=None, scratch_dir=scratch, progress=base.progress, log=log, current=current,
                         settings=settings, _model=model or KeywordTaskModel())


def report_batch(n: int = 3, *, feedback: str | None = f"Wrong: the answer must give the magic word {KEYWORD}.",
                 score: float = 0.0, start: int = 0, scenario: str = "default") -> Batch:
    items = []
    for i in range(start, start + n):
        q = f"Question {i}: {QUESTIONS[i % len(QUESTIONS)]}"
        rec = ExperienceRecord(
            id=f"rec{i}", scenario=scenario, session=None, release_id=None, created_at=None, status="ok",
            model="m", route="chat.completions", request={"model": "m", "messages": [{"role": "user", "content": q}]},
            response={"choices": [{"index": 0, "message": {"role": "assistant", "content": keyword_answer("", q)}}]})
        items.append(Experience(report_id=f"rep{i}", scenario=scenario, score=score, feedback=feedback, metadata={},
                                created_at=None, records=(rec,)))
    return Batch(scenario, items)


def publish(candidate_dir: Path, dest: Path, release_id: str, scenario: str = "default") -> ActiveRelease:
    """The candidate's artifact as the serving release (what the gate and the chain would do)."""
    import shutil

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(candidate_dir, dest)
    return ActiveRelease(scenario=scenario, release_id=release_id, content_hash=release_id, path=dest)
