"""What a fake upstream answers: a ``Reply`` (text and/or tool calls), and helpers that read
a request body in either dialect so one responder serves both fakes."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_ids = itertools.count(1)


@dataclass
class ToolCall:
    """A tool call the fake model makes; ``id`` is generated when empty."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"call_fake_{next(_ids)}"


@dataclass
class Reply:
    """One answer of the fake model.

    ``stop`` is ``"end"`` (natural end), ``"length"`` (max tokens) or ``"tool"``; by default
    ``"tool"`` when there are tool calls, else ``"end"``. Token counts default to word counts.
    """

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None

    @property
    def stop_kind(self) -> str:
        return self.stop or ("tool" if self.tool_calls else "end")


#: A responder gets the request body (in the fake's dialect) and returns a Reply or a string.
Responder = Callable[[dict[str, Any]], Reply | str]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content
                         if isinstance(p, dict) and p.get("type") == "text")
    return ""


# The helpers below accept any JSON (tests send malformed bodies on purpose): what is not
# shaped as expected is skipped, never an exception inside the fake upstream.


def system_prompt(body: dict[str, Any]) -> str:
    """The system prompt of an OpenAI (system/developer messages) or Anthropic (``system``) body."""
    if "system" in body:
        return _text(body["system"])
    messages = body.get("messages")
    return "\n\n".join(_text(m.get("content")) for m in (messages if isinstance(messages, list) else [])
                       if isinstance(m, dict) and m.get("role") in ("system", "developer"))


def last_user_text(body: dict[str, Any]) -> str:
    """Text of the last user message that has text (tool results are not user text)."""
    messages = body.get("messages")
    for m in reversed(messages if isinstance(messages, list) else []):
        if isinstance(m, dict) and m.get("role") == "user":
            text = _text(m.get("content"))
            if text:
                return text
    return ""


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Tool results in the body as ``{"id", "content"}``, from either dialect."""
    out = []
    messages = body.get("messages")
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "tool":
            out.append({"id": m.get("tool_call_id", ""), "content": _text(m.get("content"))})
        elif m.get("role") == "user" and isinstance(m.get("content"), list):
            for b in m["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    out.append({"id": b.get("tool_use_id", ""), "content": _text(b.get("content"))})
    return out


def tool_names(body: dict[str, Any]) -> list[str]:
    """Names of the tools the request offers, from either dialect."""
    names = []
    tools = body.get("tools")
    for t in tools if isinstance(tools, list) else []:
        if not isinstance(t, dict):
            continue
        fn = t.get("function")
        source = fn if isinstance(fn, dict) else t
        if isinstance(source.get("name"), str):
            names.append(source["name"])
    return names


def echo(body: dict[str, Any]) -> Reply:
    """The default responder: ``"echo: <last user text>"``."""
    return Reply(text=f"echo: {last_user_text(body)}")


def prompt_tokens(body: dict[str, Any]) -> int:
    words = len(system_prompt(body).split())
    messages = body.get("messages")
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, dict):
            words += len(_text(m.get("content")).split())
    return max(words, 1)
