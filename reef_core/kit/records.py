"""Recorded requests and answers in one shape, whatever route served them.

Reef records what the client sent: a Chat Completions body (``messages``), an Anthropic Messages
body (``system`` + ``messages``) or a Responses body (``instructions`` + ``input`` items, the whole
conversation when ``previous_response_id`` was resolved). A recipe that reads conversations
calls ``chat_request`` and ``chat_reply`` and sees Chat Completions shapes for the two OpenAI
routes (Anthropic bodies keep their content blocks; their ``system`` becomes the first message).

Records of a Responses upstream (``runtime.dialect: responses``) keep what Chat Completions
cannot say; the chat view represents or skips it (``CHAT_VIEW``): a ``custom`` (free-form) tool
is a function whose one argument ``input`` holds the text, and its calls and outputs are
function calls and outputs; an ``additional_tools`` item's tools join ``tools``; reasoning
items, hosted tools (web search, file search, code interpreter, MCP …) and their calls are
left out. The record itself is never changed.
"""

from __future__ import annotations

import json
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
            return responses_to_chat(responses_chat_view(request))
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
            item = _custom_as_function(item)
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


#: how the chat view shows what a Responses record holds beyond Chat Completions
CHAT_VIEW = {
    "custom tool": "a function tool with one string argument, input",
    "custom_tool_call / custom_tool_call_output": "function_call / function_call_output ({\"input\": text})",
    "additional_tools item": "its tools join the request's tools",
    "reasoning item": "left out",
    "hosted tools and their calls (web_search, file_search, code_interpreter, mcp, …)": "left out",
}
#: input item types the chat view carries (after ``_custom_as_function``)
_CHAT_ITEMS = frozenset({"message", "function_call", "function_call_output"})


def _custom_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    out = {"type": "function", "name": tool.get("name"),
           "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}}
    if tool.get("description"):
        out["description"] = tool["description"]
    return out


def _custom_as_function(item: Mapping[str, Any]) -> Mapping[str, Any]:
    """A custom tool's call or output as a function's (other items as they are)."""
    kind = item.get("type")
    if kind == "custom_tool_call":
        return {"type": "function_call", "call_id": item.get("call_id"), "name": item.get("name"),
                "arguments": json.dumps({"input": item.get("input") or ""})}
    if kind == "custom_tool_call_output":
        return {"type": "function_call_output", "call_id": item.get("call_id"), "output": item.get("output")}
    return item


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, Mapping):
            continue
        if tool.get("type") in ("function", "namespace"):
            out.append(dict(tool))
        elif tool.get("type") == "custom":
            out.append(_custom_tool(tool))
    return out


def responses_chat_view(request: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded Responses body reduced to what Chat Completions can say (``CHAT_VIEW``)."""
    body = dict(request)
    value = request.get("input")
    tools = _chat_tools(request.get("tools"))
    if isinstance(value, list):
        kept = []
        for item in value:
            if not isinstance(item, Mapping):
                continue
            if item.get("type") == "additional_tools":
                tools += _chat_tools(item.get("tools"))
                continue
            item = _custom_as_function(item)
            if item.get("type", "message" if "role" in item else None) in _CHAT_ITEMS:
                kept.append(item)
        body["input"] = kept
    tools = list({str(t.get("name")): t for t in tools}.values())  # a tool named twice is one tool
    if tools:
        body["tools"] = tools
    else:
        body.pop("tools", None)
    choice = request.get("tool_choice")
    if isinstance(choice, Mapping) and (not tools or choice.get("type") != "function"):
        body.pop("tool_choice", None)
    return body
