"""A held-out task as a request body: what the ``task_suite`` evaluator and GEPA's validation send.

A task is ``{id?, prompt | messages, system?, expected?, pattern?, grader?}`` (``evaluator.tasks``).
``task_body`` turns one into a chat request in the runtime's dialect, so every component that runs
tasks asks the model the same question; ``content_text`` is the plain text of a message's content,
whether a string or a list of parts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: ``max_tokens`` of an Anthropic-dialect task request, which the Messages API requires
ANTHROPIC_MAX_TOKENS = 1024
#: roles that carry instructions; the Anthropic dialect takes them as the top-level ``system``
_SYSTEM_ROLES = ("system", "developer")
_TEXT_PARTS = ("text", "input_text", "output_text")


def content_text(content: Any) -> str:
    """Plain text of an OpenAI or Anthropic content value: a string as is, the text parts of a list
    one per line (images, tool calls and other parts have no text), nothing for ``None``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p if isinstance(p, str) else str(p.get("text", "")) for p in content
                         if isinstance(p, str) or isinstance(p, dict) and p.get("type", "text") in _TEXT_PARTS)
    return str(content)


def task_body(task: Mapping[str, Any], dialect: str, model: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The request body of ``task`` in the runtime's ``dialect`` (``openai`` or ``anthropic``).

    The task's ``messages`` (or its ``prompt`` as one user message) are copied, never shared with
    the task. ``system`` comes first; for the Anthropic dialect it and every system or developer
    message are joined into the top-level ``system`` text, and ``max_tokens`` defaults to
    ``ANTHROPIC_MAX_TOKENS``. ``params`` (sampling fields) go in last and win.
    """
    messages = [dict(m) for m in (task.get("messages") or [{"role": "user", "content": task["prompt"]}])]
    system = task.get("system")
    if dialect == "anthropic":
        texts = [str(system)] if system else []
        rest = []
        for m in messages:
            if m.get("role") in _SYSTEM_ROLES:
                texts.append(content_text(m.get("content")))
            else:
                rest.append(m)
        body: dict[str, Any] = {"model": model, "max_tokens": ANTHROPIC_MAX_TOKENS, "messages": rest, **params}
        if any(texts):
            body["system"] = "\n\n".join(t for t in texts if t)
        return body
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return {"model": model, "messages": messages, **params}
