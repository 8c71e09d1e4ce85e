"""The teachers' prompts of OpenClaw's distillation: the served conversation with a hint
appended to the last user message, rendered as the runtime renders prompts (the tokenizer's
chat template with the generation prompt). The server renders them; the learner only needs
their token ids."""

from __future__ import annotations

from typing import Any

from reef_train.prompts import chat_prompt_ids

HINT_PREFIX = "\n\nHint: "


def openai_messages(request: dict[str, Any], route: str | None) -> list[dict[str, Any]]:
    """The request's conversation in the OpenAI shape the chat template renders (an Anthropic
    request's ``system`` and text blocks become plain messages)."""
    if not (route or "").startswith("anthropic"):
        return [dict(m) for m in request.get("messages") or [] if isinstance(m, dict)]
    out: list[dict[str, Any]] = []
    system = request.get("system")
    if system:
        text = system if isinstance(system, str) else "".join(
            b.get("text", "") for b in system if isinstance(b, dict))
        out.append({"role": "system", "content": text})
    for m in request.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
        out.append({"role": m.get("role"), "content": content or ""})
    return out


def with_hint(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """``messages`` with ``hint`` appended to the last user message (a new user message when
    there is none)."""
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                m["content"] = [*content, {"type": "text", "text": HINT_PREFIX + hint}]
            else:
                m["content"] = f"{content or ''}{HINT_PREFIX}{hint}"
            return out
    out.append({"role": "user", "content": HINT_PREFIX.strip() + " " + hint})
    return out


def teacher_prompt_ids(tokenizer: Any, request: dict[str, Any], route: str | None, hint: str) -> list[int]:
    """The hinted conversation rendered as the runtime renders prompts (chat template, generation prompt)."""
    messages = with_hint(openai_messages(request, route), hint)
    return chat_prompt_ids(tokenizer, messages, request.get("tools"))
