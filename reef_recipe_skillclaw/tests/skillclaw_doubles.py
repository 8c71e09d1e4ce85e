"""Test doubles for the skillclaw recipe: a scripted evolver (a test double behind the same
``Evolver`` interface as the runtime and an endpoint) and experiences built like recorded traffic."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reef_core import ActiveRelease, Experience, ExperienceRecord

Reply = str | Callable[[str], str] | Exception


class ScriptedEvolver:
    """Answers each night step by the prompt's first words: ``replies[step]`` is a string, a
    function of the prompt, or an exception to raise; a list is used in order. Records every call."""

    def __init__(self, **replies: Reply | list[Reply]):
        self.replies = replies
        self.calls: list[tuple[str, str, float]] = []

    def step_of(self, prompt: str) -> str:
        if prompt.startswith("You review"):
            return "summarize"
        if prompt.startswith("You grade"):
            return "judge"
        if "A new version of the skill" in prompt:
            return "merge"
        if "Today's sessions without a skill" in prompt:
            return "create"
        return "decide"

    def chat(self, messages: list[dict[str, Any]], *, temperature: float, max_tokens: int) -> str:
        prompt = messages[-1]["content"]
        step = self.step_of(prompt)
        self.calls.append((step, prompt, temperature))
        reply = self.replies.get(step, _DEFAULTS.get(step, ""))
        if isinstance(reply, list):
            reply = reply.pop(0) if len(reply) > 1 else reply[0]
        if isinstance(reply, Exception):
            raise reply
        return reply(prompt) if callable(reply) else reply

    def steps(self) -> list[str]:
        return [c[0] for c in self.calls]


_DEFAULTS = {"summarize": "The agent answered; the outcome follows from its answer.",
             "judge": json.dumps({"task_completion": 1, "response_quality": 0.5, "efficiency": 1, "tool_usage": 1,
                                  "reason": "done"}),
             "decide": '{"action": "skip", "rationale": "nothing to change"}',
             "create": '{"action": "skip", "rationale": "no pattern"}',
             "merge": '{"description": "merged", "content": "merged text"}'}


def decision(action: str, name: str | None = None, description: str = "", content: str = "",
             rationale: str = "because", fault: str = "skill") -> str:
    body = {"action": action, "description": description, "content": content, "rationale": rationale, "fault": fault}
    if name is not None:
        body["name"] = name
    return json.dumps(body)


def record(rid: str, question: str, answer: str, *, session: str | None = None, seq: int = 1,
           messages: list[dict[str, Any]] | None = None, tool_calls: list[dict[str, Any]] | None = None,
           status: str = "ok") -> ExperienceRecord:
    msg: dict[str, Any] = {"role": "assistant", "content": answer}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return ExperienceRecord(
        id=rid, scenario="default", session=session, release_id="rel", created_at=None, status=status,
        model="m", route="chat.completions",
        request={"model": "m", "messages": messages or [{"role": "user", "content": question}]},
        response={"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}, seq=seq)


def experience(i: int, score: float | None, *, question: str = "What is 2 + 3?", answer: str = "5",
               feedback: Any = None, skills: list[str] | None = None,
               records: tuple[ExperienceRecord, ...] | None = None,
               session_records: tuple[ExperienceRecord, ...] = ()) -> Experience:
    recs = records or (record(f"rec{i}", question, answer, seq=i + 1),)
    return Experience(report_id=f"rpt{i}", scenario="default", score=score, feedback=feedback,
                      metadata={"skills": skills} if skills is not None else {}, created_at=None, records=recs,
                      session_records=session_records)


def skill_md(name: str, description: str, body: str) -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n\n{body}\n"


def release_with_skills(root: Path, skills: dict[str, tuple[str, str]], release_id: str = "rel1") -> ActiveRelease:
    harness = root / "harness"
    harness.mkdir(parents=True, exist_ok=True)
    (harness / "system.md").write_text("You are an agent.\n")
    for name, (description, body) in skills.items():
        (harness / "skills" / name).mkdir(parents=True, exist_ok=True)
        (harness / "skills" / name / "SKILL.md").write_text(skill_md(name, description, body))
    return ActiveRelease(scenario="default", release_id=release_id, content_hash="x", path=root)


#: the create decision that knows the right skill for "What is a + b?"
SUMS_SKILL = decision("create_skill", "sums", "Use for 'What is a + b?': answer with the number only",
                      "Add the two numbers and reply with the sum alone.\nExample: What is 3 + 4? -> 7")
