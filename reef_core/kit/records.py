"""Recorded requests and answers in one shape, whatever route served them.

Reef records what the client sent: a Chat Completions body (``messages``), an Anthropic Messages
body (``system`` + ``messages``) or a Responses body (``instructions`` + ``input`` items, the whole
conversation when ``previous_response_id`` was resolved). A recipe that reads conversations
calls ``chat_request`` and ``chat_reply`` and sees Chat Completions shapes for the two OpenAI
routes (Anthropic bodies keep their content blocks; their ``system`` becomes the first message).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .tasks import content_text


def chat_request(request: Any) -> dict[str, Any]:
    """``request`` as a Chat Completions body: ``messages`` always present (empty when the body
    has none or cannot be read); a copy, never the recorded object."""
    if not isinstance(request, Mapping):
        return {"messages": []}
    if "messages" not in request and ("input" in request or "instructions" in request):
        from ..serve.dialects.responses_api import responses_to_chat
        from ..serve.errors import ClientError

        try:
            return responses_to_chat(dict(request))
        except (ClientError, TypeError, ValueError, AttributeError):
            return {"messages": []}
    body = dict(request)
    messages = [dict(m) for m in request.get("messages") or [] if isinstance(m, Mapping)]
    system = request.get("system")
    if system:  # Anthropic: the instructions live beside the messages
        messages.insert(0, {"role": "system", "content": content_text(system)})
        body.pop("system", None)
    body["messages"] = messages
    return body


def chat_reply(response: Any) -> dict[str, Any] | None:
    """The assistant message of a recorded answer (``{"role": "assistant", "content", "tool_calls"?}``):
    a chat completion's first choice, a Responses object's output items, or an Anthropic message
    (its content blocks as they are). None when there is no answer."""
    if not isinstance(response, Mapping):
        return None
    if response.get("object") == "response" or "output" in response and "choices" not in response:
        text, calls = [], []
        for item in response.get("output") or []:
            if not isinstance(item, Mapping):
                continue
            if item.get("type") == "message":
                text.append(content_text(item.get("content")))
            elif item.get("type") == "function_call":
                calls.append({"id": item.get("call_id"), "type": "function",
                              "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}})
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
        if calls:
            message["tool_calls"] = calls
        return message
    if response.get("type") == "message":
        return {"role": "assistant", "content": response.get("content")}
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        message = choices[0].get("message")
        return {**message, "role": "assistant"} if isinstance(message, Mapping) else None
    return None
