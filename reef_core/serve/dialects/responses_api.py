"""The OpenAI Responses API as a client dialect, translated through Chat Completions.

A Responses request (``input`` as a string or items, ``instructions``, function ``tools``)
becomes a Chat Completions body, which the other translators carry to whichever dialect
the runtime speaks; the runtime's answer comes back as a Chat Completions body (or chunk
stream) and is turned into a ``response`` object (or the Responses event sequence).

Items Reef cannot carry to a chat upstream are refused with a 400 naming them: built-in
tools (web search, file search, computer use, code interpreter, …) and input items other
than messages, function calls, function call outputs and reasoning (reasoning items are
dropped: a chat upstream has nowhere to put them).
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import ClientError
from .requests import _text_of, tool_result_media
from .streams import ToolIndex

Event = dict[str, Any]

#: built-in Responses tools, which only OpenAI's own service runs
BUILTIN_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
    "file_search", "computer_use_preview", "computer_use", "code_interpreter", "image_generation",
    "mcp", "local_shell", "shell", "apply_patch",
})
#: request fields echoed into the ``response`` object
_ECHO = ("instructions", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p",
         "max_output_tokens", "previous_response_id", "metadata", "user", "reasoning", "truncation")


# ---------------------------------------------------------------------------- requests


def input_items(value: Any, param: str = "input") -> list[dict[str, Any]]:
    """``input`` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise ClientError(f"{param}[{i}]: each input item must be an object", param=f"{param}.{i}")
        return list(value)
    raise ClientError(f"{param}: must be a string or an array of input items", param=param)


def _parts(content: Any, where: str, param: str, field: str = "content") -> list[dict[str, Any]]:
    """Responses content parts as Chat Completions content parts (``where``/``param``: the item,
    ``field``: its field holding them)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ClientError(f"{where}.{field}: must be a string or an array of content parts", param=f"{param}.{field}")
    out: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "summary_text"):
            if not isinstance(part.get("text"), str):  # OpenAI requires it: not an empty message in its place
                raise ClientError(f"{where}.{field}[{j}]: a {kind} part needs its 'text' (a string)",
                                  param=f"{param}.{field}.{j}.text")
            out.append({"type": "text", "text": part["text"]})
        elif kind == "refusal":
            out.append({"type": "text", "text": str(part.get("refusal", ""))})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail") in ("low", "high"):
                image["detail"] = part["detail"]
            out.append({"type": "image_url", "image_url": image})
        else:
            shown = kind if kind == "input_file" else (kind or "untyped part")
            raise ClientError(f"{where}.{field}[{j}]: content of type {shown!r} is not supported by Reef "
                              f"(send input_text, output_text or input_image with an image_url)",
                              param=f"{param}.{field}.{j}")
    return out


def _chat_content(parts: list[dict[str, Any]]) -> Any:
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _text_of(output)
    return "" if output is None else str(output)


#: joins a namespace and a tool name into one Chat Completions function name
NAMESPACE_SEP = "__"


def namespaces(request: dict[str, Any]) -> frozenset[str]:
    """The tool namespaces a Responses request declares (``{"type": "namespace", "tools": [...]}``)."""
    tools = request.get("tools")
    return frozenset(str(t.get("name")) for t in tools if isinstance(t, dict) and t.get("type") == "namespace") \
        if isinstance(tools, list) else frozenset()


def split_name(name: str, spaces: frozenset[str]) -> dict[str, str]:
    """``name`` and, for a flattened namespace tool, its ``namespace``."""
    head, sep, rest = name.partition(NAMESPACE_SEP)
    return {"name": rest, "namespace": head} if sep and head in spaces else {"name": name}


def _tools(tools: Any, namespace: str | None = None, where: str = "tools") -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise ClientError(f"{where}: must be an array of tools", param=where.replace("[", ".").replace("]", ""))
    out = []
    for i, tool in enumerate(tools):
        param = f"{where}.{i}".replace("[", ".").replace("]", "")
        if not isinstance(tool, dict):
            raise ClientError(f"{where}[{i}]: each tool must be an object", param=param)
        kind = tool.get("type")
        if not isinstance(kind, str):  # (a list or an object is no tool type, and no set member either)
            raise ClientError(f"{where}[{i}].type: must be a string", param=f"{param}.type")
        if kind == "namespace" and namespace is None:  # a group of function tools (Codex's sub-agent tools)
            out += _tools(tool.get("tools") or [], str(tool.get("name", "")), f"tools[{i}].tools")
        elif kind == "function":
            name = str(tool.get("name", ""))
            fn: dict[str, Any] = {"name": f"{namespace}{NAMESPACE_SEP}{name}" if namespace else name,
                                  "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
            if tool.get("description"):
                fn["description"] = tool["description"]
            if tool.get("strict") is not None:
                fn["strict"] = tool["strict"]
            out.append({"type": "function", "function": fn})
        elif kind in BUILTIN_TOOLS:
            raise ClientError(f"{where}[{i}]: the built-in tool {kind!r} is not supported by Reef: only OpenAI's "
                              f"own service runs it; declare it as a function tool your client executes",
                              param=f"{param}.type")
        else:
            raise ClientError(f"{where}[{i}]: tool type {kind!r} is not supported by Reef (only 'function' and "
                              f"'namespace')", param=f"{param}.type")
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str) and choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict):
        if choice.get("type") == "function" and isinstance(choice.get("name"), str) and choice["name"]:
            return {"type": "function", "function": {"name": choice["name"]}}
        raise ClientError(f"tool_choice: {choice.get('type')!r} is not supported by Reef "
                          f"(use auto, none, required or a function)", param="tool_choice")
    raise ClientError("tool_choice: must be auto, none, required or {type: function, name}", param="tool_choice")


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request body as a Chat Completions request body."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        messages.append({"role": "system", "content": _text_of(instructions)})
    tool_media: list[dict[str, Any]] = []  # images of the tool outputs just read, for one user message
    for i, item in enumerate(input_items(body.get("input"))):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if tool_media and kind != "function_call_output":
            messages.append({"role": "user", "content": tool_media})
            tool_media = []
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ClientError(f"{where}.role: {role!r} is not one of user, assistant, system, developer",
                                  param=f"input.{i}.role")
            parts = _parts(item.get("content"), where, f"input.{i}")
            if role == "assistant":
                text = "".join(p.get("text", "") for p in parts if p["type"] == "text")
                messages.append({"role": "assistant", "content": text})
            else:
                messages.append({"role": "system" if role == "developer" else role, "content": _chat_content(parts)})
        elif kind == "function_call":
            name = str(item.get("name", ""))
            if item.get("namespace"):
                name = f"{item['namespace']}{NAMESPACE_SEP}{name}"
            call = {"id": str(item.get("call_id") or item.get("id") or f"call_{i}"), "type": "function",
                    "function": {"name": name, "arguments": item.get("arguments") or "{}"}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last.get("content") == "":
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = str(item.get("call_id", ""))
            output = item.get("output")
            media = []
            if isinstance(output, list):  # text and images: a tool message holds the text only
                parts = _parts(output, where, f"input.{i}", "output")
                media = [p for p in parts if p["type"] != "text"]
                output = "\n".join(p["text"] for p in parts if p["type"] == "text")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": _output_text(output)})
            if media:  # after this turn's tool messages, which must follow their calls unbroken
                tool_media += tool_result_media(call_id, media)
            continue
        elif kind == "reasoning":
            continue  # a chat upstream has no place for reasoning items (often encrypted anyway)
        else:
            raise ClientError(f"{where}: input item type {kind!r} is not supported by Reef (send message, "
                              f"function_call, function_call_output or reasoning items; previous_response_id "
                              f"instead of item_reference)", param=f"input.{i}.type")
    if tool_media:
        messages.append({"role": "user", "content": tool_media})
    if not any(m["role"] != "system" for m in messages):
        raise ClientError("input: at least one message or function call output is required", param="input")
    if body.get("top_logprobs"):  # the translated answer's output_text carries no logprobs
        raise ClientError("top_logprobs: this server answers the Responses API through Chat Completions, which "
                          "returns no logprobs here; leave top_logprobs out (or 0)", param="top_logprobs")
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for key in ("temperature", "top_p", "parallel_tool_calls", "user", "stream"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
        if body.get("tool_choice") is not None:
            out["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {"name": fmt.get("name") or "output", "schema": fmt.get("schema") or {}}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:  # Codex sends it with every turn
        out["reasoning_effort"] = reasoning["effort"]
    return out


def output_as_input(output: Any) -> list[dict[str, Any]]:
    """A stored response's ``output`` items as input items of the next turn."""
    items = []
    for item in output or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": _text_of(item.get("content"))}]})
        elif item.get("type") == "function_call":
            call = {"type": "function_call", "call_id": item.get("call_id"), "name": item.get("name"),
                    "arguments": item.get("arguments") or "{}"}
            if item.get("namespace"):
                call["namespace"] = item["namespace"]
            items.append(call)
    return items


# ---------------------------------------------------------------------------- responses


def responses_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    """Chat Completions usage as Responses usage."""
    usage = usage or {}
    inp = usage.get("prompt_tokens") or 0
    out = usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {"input_tokens": inp, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": usage.get("total_tokens") or inp + out}


_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def response_object(request: dict[str, Any], response_id: str, *, model: str, created: int, status: str,
                    output: list[dict[str, Any]], usage: dict[str, Any] | None,
                    finish_reason: str | None = None) -> dict[str, Any]:
    """A ``response`` object; ``status`` is ``in_progress`` while streaming, else set from the finish."""
    reason = _INCOMPLETE.get(finish_reason or "")
    if status != "in_progress":
        status = "incomplete" if reason else "completed"
    body: dict[str, Any] = {"id": response_id, "object": "response", "created_at": created, "status": status,
                            "error": None, "incomplete_details": {"reason": reason} if reason else None,
                            "model": model or request.get("model") or "", "output": output}
    for key in _ECHO:
        body[key] = request.get(key)
    body["tools"] = request.get("tools") or []
    body["tool_choice"] = request.get("tool_choice") or "auto"
    body["parallel_tool_calls"] = request.get("parallel_tool_calls", True)
    body["store"] = request.get("store", True) is not False
    body["text"] = request.get("text") or {"format": {"type": "text"}}
    body["truncation"] = request.get("truncation") or "disabled"
    body["metadata"] = request.get("metadata") or {}
    body["usage"] = usage
    return body


def _message_item(response_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": "msg_" + response_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(call_id: str, name: str, arguments: str, spaces: frozenset[str],
               status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": "fc_" + call_id, "call_id": call_id, **split_name(name, spaces),
            "arguments": arguments, "status": status}


def chat_to_responses(body: dict[str, Any], request: dict[str, Any], response_id: str) -> dict[str, Any]:
    """A Chat Completions response body as a ``response`` object answering ``request``."""
    choice = (body.get("choices") or [{}])[0] or {}
    message = choice.get("message") or {}
    output = []
    text = message.get("content")
    if isinstance(text, list):
        text = _text_of(text)
    if text:
        output.append(_message_item(response_id, text))
    for k, tc in enumerate(message.get("tool_calls") or []):
        fn = tc.get("function") or {}
        output.append(_call_item(str(tc.get("id") or f"call_{k}"), str(fn.get("name", "")),
                                 fn.get("arguments") or "{}", namespaces(request)))
    if output and _INCOMPLETE.get(choice.get("finish_reason") or ""):
        output[-1]["status"] = "incomplete"  # the item the cut (max_output_tokens) ended
    usage = responses_usage(body.get("usage")) if body.get("usage") else None
    return response_object(request, response_id, model=body.get("model", ""), created=int(time.time()),
                           status="completed", output=output, usage=usage,
                           finish_reason=choice.get("finish_reason"))


# ---------------------------------------------------------------------------- streams


class ChatToResponsesStream:
    """``chat.completion.chunk`` objects → the Responses event sequence: ``response.created``,
    ``response.in_progress``, per output item ``output_item.added`` / deltas / ``…done``,
    then ``response.completed`` (or ``response.incomplete``) with usage."""

    def __init__(self, request: dict[str, Any], response_id: str):
        self.request = request
        self.namespaces = namespaces(request)
        self.id = response_id
        self.model = ""
        self.created = int(time.time())
        self.seq = 0
        self.started = False
        self.items: list[dict[str, Any]] = []  # output items in order (open or done)
        self.text_index: int | None = None  # output index of the open message item
        self.calls: dict[int, int] = {}  # chat tool_calls index -> output index
        self.tool_index = ToolIndex()
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def _ev(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _response(self, status: str) -> dict[str, Any]:
        # none when the upstream reported none (as ``chat_to_responses`` answers): zeros would be a count
        usage = responses_usage(self.usage) if status != "in_progress" and self.usage else None
        return response_object(self.request, self.id, model=self.model, created=self.created, status=status,
                               output=[i for i in self.items if i.get("status") in ("completed", "incomplete")]
                               if status != "in_progress" else [], usage=usage, finish_reason=self.finish_reason)

    def _start(self) -> list[Event]:
        self.started = True
        return [self._ev("response.created", response=self._response("in_progress")),
                self._ev("response.in_progress", response=self._response("in_progress"))]

    def _close_text(self, status: str = "completed") -> list[Event]:
        if self.text_index is None:
            return []
        idx, self.text_index = self.text_index, None
        item = self.items[idx]
        item["status"] = status
        part = item["content"][0]
        return [self._ev("response.output_text.done", item_id=item["id"], output_index=idx, content_index=0,
                         text=part["text"], logprobs=[]),
                self._ev("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0,
                         part=dict(part)),
                self._ev("response.output_item.done", output_index=idx, item=_copy_item(item))]

    def feed(self, chunk: Event) -> list[Event]:
        self.model = chunk.get("model") or self.model
        out = [] if self.started else self._start()
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                if self.text_index is None:
                    self.text_index = len(self.items)
                    suffix = "" if self.text_index == 0 else f"_{self.text_index}"
                    item = _message_item(self.id + suffix, "", status="in_progress")
                    self.items.append(item)
                    out.append(self._ev("response.output_item.added", output_index=self.text_index,
                                        item={**item, "content": []}))
                    out.append(self._ev("response.content_part.added", item_id=item["id"],
                                        output_index=self.text_index, content_index=0,
                                        part={"type": "output_text", "text": "", "annotations": []}))
                item = self.items[self.text_index]
                item["content"][0]["text"] += text
                out.append(self._ev("response.output_text.delta", item_id=item["id"], output_index=self.text_index,
                                    content_index=0, delta=text, logprobs=[]))
            for tc in delta.get("tool_calls") or []:
                k = self.tool_index.of(tc)
                fn = tc.get("function") or {}
                if k not in self.calls:
                    out += self._close_text()
                    self.calls[k] = len(self.items)
                    item = _call_item(str(tc.get("id") or f"call_{k}"), str(fn.get("name") or ""), "",
                                      self.namespaces, status="in_progress")
                    self.items.append(item)
                    out.append(self._ev("response.output_item.added", output_index=self.calls[k],
                                        item=dict(item)))
                item = self.items[self.calls[k]]
                if fn.get("arguments"):
                    item["arguments"] += fn["arguments"]
                    out.append(self._ev("response.function_call_arguments.delta", item_id=item["id"],
                                        output_index=self.calls[k], delta=fn["arguments"]))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def finish(self) -> list[Event]:
        out = [] if self.started else self._start()
        # the item still being written when the answer was cut (max_output_tokens) is incomplete
        cut = len(self.items) - 1 if _INCOMPLETE.get(self.finish_reason or "") else None
        out += self._close_text("incomplete" if self.text_index == cut else "completed")
        for k in sorted(self.calls):
            idx = self.calls[k]
            item = self.items[idx]
            item["status"] = "incomplete" if idx == cut else "completed"
            item["arguments"] = item["arguments"] or "{}"
            out.append(self._ev("response.function_call_arguments.done", item_id=item["id"], output_index=idx,
                                name=item["name"], arguments=item["arguments"]))
            out.append(self._ev("response.output_item.done", output_index=idx, item=_copy_item(item)))
        final = self._response("completed")
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        out.append(self._ev(kind, response=final))
        return out


def _copy_item(item: dict[str, Any]) -> dict[str, Any]:
    copy = dict(item)
    if "content" in copy:
        copy["content"] = [dict(p) for p in copy["content"]]
    return copy


class Chained:
    """Two stream translators in a row (runtime → Chat Completions → Responses, or Responses →
    Chat Completions → Anthropic)."""

    def __init__(self, first: Any, second: Any):
        self.first = first
        self.second = second

    def feed(self, event: Event) -> list[Event]:
        return [out for mid in self.first.feed(event) for out in self.second.feed(mid)]

    def finish(self) -> list[Event]:
        out = [o for mid in self.first.finish() for o in self.second.feed(mid)]
        return out + self.second.finish()


TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


class ResponsesAssembler:
    """Folds Responses stream events into the ``response`` object (partial for a broken stream)."""

    def __init__(self) -> None:
        self.events = 0
        self.response: dict[str, Any] | None = None
        self.items: dict[int, dict[str, Any]] = {}
        self.final: dict[str, Any] | None = None

    def add(self, event: Event) -> None:
        self.events += 1
        kind = event.get("type")
        if kind in ("response.created", "response.in_progress"):
            self.response = dict(event.get("response") or {})
        elif kind in ("response.output_item.added", "response.output_item.done"):
            self.items[event.get("output_index", 0)] = _copy_item(event.get("item") or {})
        elif kind == "response.output_text.delta":
            item = self.items.get(event.get("output_index", 0))
            if item is not None:
                content = item.setdefault("content", [])
                if not content:
                    content.append({"type": "output_text", "text": "", "annotations": []})
                content[0]["text"] = content[0].get("text", "") + str(event.get("delta", ""))
        elif kind == "response.function_call_arguments.delta":
            item = self.items.get(event.get("output_index", 0))
            if item is not None:
                item["arguments"] = item.get("arguments", "") + str(event.get("delta", ""))
        elif kind == "response.custom_tool_call_input.delta":  # a Responses upstream's free-form tool call
            item = self.items.get(event.get("output_index", 0))
            if item is not None:
                item["input"] = item.get("input", "") + str(event.get("delta", ""))
        elif kind in TERMINAL_EVENTS:
            self.final = dict(event.get("response") or {})

    def result(self) -> dict[str, Any]:
        if self.final is not None:
            return self.final
        body = dict(self.response or {"object": "response"})
        body["status"] = "incomplete"
        # an item the stream had not finished is as incomplete as the response, not in progress
        body["output"] = [{**item, "status": "incomplete"} if item.get("status") == "in_progress" else item
                          for item in (self.items[k] for k in sorted(self.items))]
        return body
