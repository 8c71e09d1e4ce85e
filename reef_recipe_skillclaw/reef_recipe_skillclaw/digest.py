"""Session digests: one task's recorded traffic and report, as the night's prompts read it.

A task is one report. Its session is every record of its ``x-reef-session`` (the ``session``
filter attaches them) plus the records it quotes; an agent sends its whole conversation with
every request, so the newest request's messages and its reply are the conversation. From that
the digest keeps the turns, each tool call with its result or error, the skills the agent read
(a tool call or text naming ``skills/<name>``, a tool argument that is a skill's name, or the
report's ``metadata.skills``), the skills the catalogue injected, and the report's score and
feedback. A score of ``None`` or the unscored sentinel (−1 by default) is not reliable: the
night's judge scores that session.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from reef_core import Experience
from reef_core.kit import chat_reply, chat_request, content_text

from .evolver import response_text
from .pool import NAME

#: skills a report may name that the pool does not hold (each becomes a group of the night's work)
MAX_UNKNOWN_SKILLS = 4

#: the group of the sessions that used no skill
NO_SKILL = ""
_SKILL_PATH = re.compile(r"skills/([A-Za-z0-9_-]{1,64})(?:/|\b)")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    result: str = ""
    error: bool = False


@dataclass
class SessionDigest:
    """What the night knows about one task."""

    task_id: str
    session: str | None
    score: float | None
    reliable: bool
    feedback: str
    turns: list[tuple[str, str]] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skills_read: list[str] = field(default_factory=list)
    skills_injected: list[str] = field(default_factory=list)
    record_ids: list[str] = field(default_factory=list)
    summary: str = ""
    judged: dict[str, Any] | None = None

    @property
    def effective_score(self) -> float | None:
        """The report's score when reliable, else the judge's overall score (None: unknown)."""
        if self.reliable:
            return self.score
        return None if self.judged is None else self.judged.get("overall")

    def render(self, max_chars: int = 6000) -> str:
        """The digest as prompt text, cut at ``max_chars`` (the conversation's middle goes first)."""
        head = [f"Task {self.task_id}" + (f" (session {self.session})" if self.session else "")]
        score = "unscored" if not self.reliable else f"{self.score:g}"
        head.append(f"Reported score: {score}")
        if self.judged is not None:
            head.append(f"Judged score: {self.judged.get('overall', 0.0):.2f}")
        if self.feedback:
            head.append(f"User feedback: {self.feedback}")
        head.append(f"Skills read: {', '.join(self.skills_read) or 'none'}")
        if self.skills_injected:
            head.append(f"Skills in the catalogue: {', '.join(self.skills_injected)}")
        if self.errors:
            head.append("Errors: " + "; ".join(self.errors))
        turns = [f"[{role}] {text}" for role, text in self.turns]
        tools = [f"[tool call] {t.name}({t.arguments})" + (" -> ERROR: " if t.error else " -> ") + t.result
                 for t in self.tool_calls]
        body = "\n".join([*turns, *(["Tool calls:", *tools] if tools else [])])
        text = "\n".join(head) + "\nConversation:\n" + body
        if len(text) > max_chars:
            keep = max(max_chars - len("\n[...]\n"), 0)
            text = text[: keep // 2] + "\n[...]\n" + text[-(keep - keep // 2):]
        return text


def _clip(text: str, limit: int = 800) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + " [...]"


def _arguments(raw: Any) -> str:
    return raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False, sort_keys=True)


def _conversation(request: dict[str, Any], reply: Any) -> tuple[list[tuple[str, str]], list[ToolCall]]:
    """Turns and tool calls of a request of any route plus its reply (``reef_core.kit.chat_request``:
    Anthropic bodies keep their blocks; Responses bodies come as Chat Completions)."""
    messages = list(chat_request(request)["messages"])
    answer = chat_reply(reply)
    if answer is not None:
        messages.append(answer)
    turns: list[tuple[str, str]] = []
    calls: dict[str, ToolCall] = {}
    order: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        role, content = str(m.get("role") or "?"), m.get("content")
        if role == "system":
            continue  # the harness and the agent's own prompt: the same on every turn
        for j, tc in enumerate(m.get("tool_calls") or []):  # OpenAI
            fn = tc.get("function") or {}
            key = tc.get("id") or f"{i}.{j}"
            calls[key] = ToolCall(str(fn.get("name") or "?"), _arguments(fn.get("arguments") or ""))
            order.append(key)
        if role == "tool":
            key = m.get("tool_call_id") or ""
            text = content_text(content)
            if key in calls:
                old = calls[key]
                calls[key] = ToolCall(old.name, old.arguments, _clip(text), _looks_failed(text))
            continue
        if isinstance(content, list):  # Anthropic blocks
            for j, block in enumerate(content):
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "tool_use":
                    key = block.get("id") or f"{i}.{j}"
                    calls[key] = ToolCall(str(block.get("name") or "?"), _arguments(block.get("input") or {}))
                    order.append(key)
                elif block.get("type") == "tool_result" and block.get("tool_use_id") in calls:
                    old = calls[block["tool_use_id"]]
                    text = content_text(block.get("content"))
                    calls[block["tool_use_id"]] = ToolCall(old.name, old.arguments, _clip(text),
                                                           bool(block.get("is_error")) or _looks_failed(text))
        text = content_text(content)
        if text.strip():
            turns.append((role, _clip(text)))
    return turns, [calls[k] for k in order]


def _looks_failed(text: str) -> bool:
    return bool(re.match(r"\s*(error|traceback|exception|failed)\b", text, re.IGNORECASE))


def build_digest(exp: Experience, pool_names: list[str], *, unscored: float = -1.0,
                 catalogue_counts_as_use: bool = False) -> SessionDigest:
    """The digest of one task (one report and its session's records)."""
    records = {r.id: r for r in (*exp.session_records, *exp.records)}
    ordered = sorted(records.values(), key=lambda r: (r.seq if r.seq is not None else 0, r.id))
    turns: list[tuple[str, str]] = []
    tools: list[ToolCall] = []
    errors = [f"request {r.id} ended {r.status}" for r in ordered if r.status != "ok"]
    served = [r for r in ordered if isinstance(r.request, dict)]
    if served:
        # the newest request carries the conversation so far; earlier ones are its prefixes
        last = served[-1]
        turns, tools = _conversation(last.request, last.response)
        if len(served) > 1 and not any(role == "user" for role, _ in turns):
            turns = [t for r in served for t in _conversation(r.request, r.response)[0]]
    score = exp.score
    reliable = score is not None and math.isfinite(score) and score != unscored
    meta_skills = exp.metadata.get("skills") if isinstance(exp.metadata, dict) else None
    if isinstance(meta_skills, str):
        meta_skills = [meta_skills]
    read = [s for s in (meta_skills or []) if isinstance(s, str)]
    known = set(pool_names)
    for call in tools:
        read += [m.group(1) for m in _SKILL_PATH.finditer(call.arguments)]
        try:
            args = json.loads(call.arguments)
        except ValueError:
            args = None
        if isinstance(args, dict):
            read += [v for v in args.values() if isinstance(v, str) and v in known]
    for _, text in turns:
        read += [m.group(1) for m in _SKILL_PATH.finditer(text)]
    # a skill the client names that the pool lacks still counts (one it made itself), but only a
    # few, by the pool's name rule: each is a group, and each group an evolver call
    named = [s for s in dict.fromkeys(meta_skills or []) if isinstance(s, str) and s not in known and NAME.match(s)]
    unknown = set(named[:MAX_UNKNOWN_SKILLS])
    read = [s for s in dict.fromkeys(read) if s in known or s in unknown]
    injected = list(pool_names)
    if catalogue_counts_as_use and not read:
        read = list(injected)
    return SessionDigest(task_id=exp.report_id, session=exp.session, score=score if reliable else None,
                         reliable=reliable, feedback=exp.feedback_text(), turns=turns, tool_calls=tools,
                         errors=errors, skills_read=read, skills_injected=injected,
                         record_ids=[r.id for r in ordered])


def group_by_skill(digests: list[SessionDigest]) -> dict[str, list[SessionDigest]]:
    """Sessions by the skill they used (a session in each skill it read); ``NO_SKILL`` holds the
    sessions that read none. Skills in name order, the no-skill bucket last."""
    groups: dict[str, list[SessionDigest]] = defaultdict(list)
    for d in digests:
        for name in d.skills_read or [NO_SKILL]:
            groups[name].append(d)
    return {k: groups[k] for k in sorted(groups, key=lambda k: (k == NO_SKILL, k))}


__all__ = ["NO_SKILL", "SessionDigest", "ToolCall", "build_digest", "group_by_skill", "response_text"]
