"""Chat Completions clients in front of a Responses upstream (``runtime.dialect: responses``).

The inverse of ``responses_api``: a Chat Completions request becomes a Responses request, and
the upstream's ``response`` object (or event stream) comes back as a chat completion (or
``chat.completion.chunk`` objects). Anthropic Messages clients go through Chat Completions on
the way (``requests.anthropic_to_openai`` before, ``streams.OpenAIToAnthropic`` after), as they
do in front of a chat upstream.

What Chat Completions cannot express is dropped on the way back: ``reasoning`` items (the
record keeps them), hosted tool calls the provider ran itself (``web_search_call`` …), and
custom tool calls (a chat client declares no custom tools, so none come). ``stop``, ``n > 1``
and ``logprobs`` have no Responses counterpart Reef carries: they are a 400 naming the field.
A chat client's ``store`` defaults to false, as Chat Completions' does, so the provider keeps
nothing unless the client asked.
"""

from __future__ import annotations

import time
from typing import Any

from ...errors import RuntimeCallError
from ..errors import ClientError
from .requests import _text_of

Event = dict[str, Any]

#: Chat Completions request fields a Responses request takes under the same name
_SAME = ("temperature", "top_p", "parallel_tool_calls", "user", "stream", "metadata", "service_tier",
         "prompt_cache_key", "safety_identifier", "top_logprobs")


# ---------------------------------------------------------------------------- requests


def _input_parts(content: Any, where: str) -> Any:
    """A user or system message's chat content as Responses input content."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ClientError(f"{where}.content: must be a string or an array of content parts", param=f"{where}.content")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "file":  # a PDF sent inline, or a file of the provider's by its id
            file = part.get("file") if isinstance(part.get("file"), dict) else {}
            parts.append({"type": "input_file", **{k: file[k] for k in ("file_data", "file_id", "filename")
                                                   if isinstance(file.get(k), str)}})
        elif kind == "text":
            parts.append({"type": "input_text", "text": str(part.get("text", ""))})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            item: dict[str, Any] = {"type": "input_image", "image_url": str(url or "")}
            if isinstance(image, dict) and image.get("detail"):
                item["detail"] = image["detail"]
            parts.append(item)
        elif isinstance(part, str):
            parts.append({"type": "input_text", "text": part})
        else:
            raise ClientError(f"{where}.content[{j}]: content of type {kind!r} cannot be sent to a Responses "
                              f"upstream (send text, image_url or file)",
                              param=f"{where.replace('[', '.').replace(']', '')}.content.{j}")
    return parts


def _tool(tool: Any, i: int) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or tool.get("type", "function") != "function":
        raise ClientError(f"tools[{i}]: only function tools can be sent to a Responses upstream",
                          param=f"tools.{i}")
    out: dict[str, Any] = {"type": "function", "name": str(fn.get("name", "")),
                           "parameters": fn.get("parameters") or {"type": "object", "properties": {}},
                           # Chat Completions functions are not strict unless they say so (Responses'
                           # default is strict, which refuses most hand-written schemas)
                           "strict": bool(fn.get("strict", False))}
    if fn.get("description"):
        out["description"] = fn["description"]
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        fn = choice.get("function") or {}
        return {"type": "function", "name": fn.get("name") if isinstance(fn, dict) else None}
    return choice


def chat_to_responses_request(body: dict[str, Any]) -> dict[str, Any]:
    """A Chat Completions request body as a Responses request body."""
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for i, message in enumerate(body.get("messages") or []):
        where = f"messages[{i}]"
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            if not items:  # leading system messages are the instructions
                instructions.append(_text_of(content))
            else:
                items.append({"type": "message", "role": role, "content": _input_parts(content, where)})
        elif role == "user":
            items.append({"type": "message", "role": "user", "content": _input_parts(content, where)})
        elif role == "assistant":
            text = _text_of(content)
            if text:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": text}]})
            for k, call in enumerate(message.get("tool_calls") or []):
                fn = call.get("function") or {}
                items.append({"type": "function_call", "call_id": str(call.get("id") or f"call_{i}_{k}"),
                              "name": str(fn.get("name", "")), "arguments": fn.get("arguments") or "{}"})
        elif role == "tool":
            # images a tool returned (a chat client may send them in a tool message) stay with its output
            media = isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image_url"
                                                      for p in content)
            items.append({"type": "function_call_output", "call_id": str(message.get("tool_call_id", "")),
                          "output": _input_parts(content, where) if media else _text_of(content)})
        else:
            raise ClientError(f"{where}.role: {role!r} is not one of system, developer, user, assistant, tool",
                              param=f"messages.{i}.role")
    if body.get("logprobs"):  # the translated answer carries no logprobs back
        raise ClientError("logprobs: the upstream speaks the Responses API, whose logprobs Reef does not carry "
                          "back to Chat Completions; leave logprobs out", param="logprobs")
    out: dict[str, Any] = {"model": body.get("model"), "input": items, "store": bool(body.get("store", False))}
    if instructions:
        out["instructions"] = "\n\n".join(instructions)
    for key in _SAME:
        if body.get(key) is not None:
            out[key] = body[key]
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if limit is not None:
        out["max_output_tokens"] = limit
    if body.get("tools"):
        out["tools"] = [_tool(t, i) for i, t in enumerate(body["tools"])]
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        text_format = {"type": "json_schema", "name": spec.get("name") or "output", "schema": spec.get("schema") or {}}
        if spec.get("strict") is not None:
            text_format["strict"] = spec["strict"]
        out["text"] = {"format": text_format}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["text"] = {"format": {"type": "json_object"}}
    if body.get("reasoning_effort"):
        out["reasoning"] = {"effort": body["reasoning_effort"]}
    return out


# ---------------------------------------------------------------------------- responses


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """Responses usage as Chat Completions usage."""
    if not isinstance(usage, dict):
        return None
    inp, out = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
    chat: dict[str, Any] = {"prompt_tokens": inp, "completion_tokens": out,
                            "total_tokens": usage.get("total_tokens") or inp + out}
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    if cached:
        chat["prompt_tokens_details"] = {"cached_tokens": cached}
    reasoning = (usage.get("output_tokens_details") or {}).get("reasoning_tokens")
    if reasoning:
        chat["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return chat


def finish_reason(response: dict[str, Any]) -> str:
    """The Chat Completions ``finish_reason`` of a ``response`` object."""
    if any(isinstance(i, dict) and i.get("type") == "function_call" for i in response.get("output") or []):
        return "tool_calls"
    reason = (response.get("incomplete_details") or {}).get("reason")
    return {"max_output_tokens": "length", "content_filter": "content_filter"}.get(reason or "", "stop")


def _failure(response: dict[str, Any]) -> RuntimeCallError:
    error = response.get("error") or {}
    message = error.get("message") if isinstance(error, dict) else None
    return RuntimeCallError(f"the upstream response failed: {message or 'no reason given'}", status=502,
                            body={"error": error} if isinstance(error, dict) else None)


def responses_to_chat_response(body: dict[str, Any]) -> dict[str, Any]:
    """A ``response`` object as a Chat Completions response body."""
    if body.get("status") == "failed":
        raise _failure(body)
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in body.get("output") or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            text.append(_text_of(item.get("content")))
        elif item.get("type") == "function_call":
            calls.append({"id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
                          "function": {"name": str(item.get("name", "")),
                                       "arguments": item.get("arguments") or "{}"}})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    out: dict[str, Any] = {"id": body.get("id") or "chatcmpl-reef", "object": "chat.completion",
                           "created": body.get("created_at") or int(time.time()), "model": body.get("model", ""),
                           "choices": [{"index": 0, "message": message, "logprobs": None,
                                        "finish_reason": finish_reason(body)}]}
    usage = chat_usage(body.get("usage"))
    if usage:
        out["usage"] = usage
    return out


class ResponsesToChatStream:
    """Responses stream events → ``chat.completion.chunk`` objects: the text deltas, function
    calls (name with the first chunk, then argument deltas), and at the terminal event the
    finish chunk and a usage chunk (which the server drops for clients that did not ask)."""

    def __init__(self) -> None:
        self.id = "chatcmpl-reef"
        self.model = ""
        self.created = int(time.time())
        self.started = False
        self.calls: dict[int, int] = {}  # output index -> tool_calls index

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> Event:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    def _start(self) -> list[Event]:
        if self.started:
            return []
        self.started = True
        return [self._chunk({"role": "assistant", "content": ""})]

    def feed(self, event: Event) -> list[Event]:
        kind = event.get("type")
        response = event.get("response") if isinstance(event.get("response"), dict) else None
        if response is not None:
            self.id = response.get("id") or self.id
            self.model = response.get("model") or self.model
            self.created = response.get("created_at") or self.created
        if kind in ("response.created", "response.in_progress"):
            return self._start()
        if kind == "response.output_text.delta":
            return [*self._start(), self._chunk({"content": str(event.get("delta", ""))})]
        item = event.get("item") if isinstance(event.get("item"), dict) else {}
        if kind == "response.output_item.added" and item.get("type") == "function_call":
            index = self.calls[event.get("output_index", 0)] = len(self.calls)
            call = {"index": index, "id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
                    "function": {"name": str(item.get("name", "")), "arguments": item.get("arguments") or ""}}
            return [*self._start(), self._chunk({"tool_calls": [call]})]
        if kind == "response.function_call_arguments.delta" and event.get("output_index", 0) in self.calls:
            index = self.calls[event.get("output_index", 0)]
            return [self._chunk({"tool_calls": [{"index": index, "function": {"arguments": str(event.get("delta", ""))}}]})]
        if kind == "response.failed":
            raise _failure(response or {})
        if kind in ("response.completed", "response.incomplete") and response is not None:
            out = [*self._start(), self._chunk({}, finish_reason(response))]
            usage = chat_usage(response.get("usage"))
            if usage:
                out.append({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                            "model": self.model, "choices": [], "usage": usage})
            return out
        return []

    def finish(self) -> list[Event]:
        return []
