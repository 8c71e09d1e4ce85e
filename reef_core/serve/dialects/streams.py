"""Streamed responses: event translation between dialects, and assembly of the final message.

A translator turns runtime stream events into client stream events (``feed`` per event,
``finish`` once at the end). An assembler folds client stream events into the message a
non-streamed call would have returned, which is what the record keeps; given a partial
stream it assembles what arrived (the record of an incomplete stream).
"""

from __future__ import annotations

import time
from typing import Any

from .. import jsonfast
from .responses import FINISH_FROM_STOP, anthropic_usage, openai_usage, stop_reason

Event = dict[str, Any]


def is_usage_chunk(event: Event) -> bool:
    """An OpenAI usage-only chunk (``choices`` empty), sent only to clients that asked for it."""
    return not event.get("choices") and bool(event.get("usage")) and "object" in event


class ToolIndex:
    """Which tool call a Chat Completions ``tool_calls`` delta belongs to: its ``index``, or for
    an upstream that sends none (Gemini's OpenAI-compatible endpoint sends each call whole, with
    its own ``id`` and no ``index``) the call its ``id`` names, a new one for a new ``id``, and
    the latest call for a delta with neither. Read as ``index or 0``, a second call's arguments
    were appended to the first's (``{"a": 1}{"b": 2}``) and its name and id lost."""

    __slots__ = ("by_id", "count", "last")

    def __init__(self) -> None:
        self.by_id: dict[str, int] = {}
        self.count = 0  # one past the highest index seen
        self.last = 0

    def of(self, tc: dict[str, Any]) -> int:
        k = tc.get("index")
        call_id = tc.get("id")
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            if isinstance(call_id, str) and call_id:
                k = self.by_id.get(call_id, self.count)
            else:
                k = self.last
        if isinstance(call_id, str) and call_id:
            self.by_id.setdefault(call_id, k)
        self.count = max(self.count, k + 1)
        self.last = k
        return k


class Passthrough:
    """Same dialect on both sides: events go through unchanged."""

    def feed(self, event: Event) -> list[Event]:
        return [event]

    def finish(self) -> list[Event]:
        return []


class AnthropicToOpenAI:
    """Anthropic Messages stream events → OpenAI ``chat.completion.chunk`` objects.

    ``finish`` always emits the usage chunk; the server drops it for clients that did not
    ask for usage (after the record has taken it)."""

    def __init__(self) -> None:
        self.id = "chatcmpl-reef"
        self.model = ""
        self.created = int(time.time())
        self.usage: dict[str, Any] = {}
        self.tool_index: dict[int, int] = {}  # Anthropic block index -> OpenAI tool_calls index

    def _chunk(self, delta: dict[str, Any] | None, finish: str | None = None) -> Event:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}]}

    def feed(self, event: Event) -> list[Event]:
        kind = event.get("type")
        if kind == "message_start":
            msg = event.get("message") or {}
            self.id = msg.get("id") or self.id
            self.model = msg.get("model") or self.model
            self.usage.update(msg.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                idx = len(self.tool_index)
                self.tool_index[event.get("index", 0)] = idx
                return [self._chunk({"tool_calls": [{"index": idx, "id": block.get("id", ""), "type": "function",
                                                     "function": {"name": block.get("name", ""), "arguments": ""}}]})]
            if block.get("type") == "text" and block.get("text"):
                return [self._chunk({"content": block["text"]})]
            return []
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            dkind = delta.get("type")
            if dkind == "text_delta":
                return [self._chunk({"content": delta.get("text", "")})]
            if dkind == "input_json_delta":
                idx = self.tool_index.get(event.get("index", 0), 0)
                return [self._chunk({"tool_calls": [{"index": idx,
                                                     "function": {"arguments": delta.get("partial_json", "")}}]})]
            return []
        if kind == "message_delta":
            self.usage.update(event.get("usage") or {})
            stop = (event.get("delta") or {}).get("stop_reason")
            if stop:
                return [self._chunk({}, FINISH_FROM_STOP.get(stop, "stop"))]
            return []
        if kind == "error":
            err = event.get("error") or {}
            raise StreamError(f"upstream stream error: {err.get('message') or err}")
        return []  # ping, content_block_stop, message_stop

    def finish(self) -> list[Event]:
        return [{"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "choices": [], "usage": openai_usage(self.usage)}]


class OpenAIToAnthropic:
    """OpenAI ``chat.completion.chunk`` objects → Anthropic Messages stream events."""

    def __init__(self) -> None:
        self.started = False
        self.block: int = -1  # index of the open content block, -1 when none
        self.block_kind: str | None = None
        self.tool_blocks: dict[int, int] = {}  # OpenAI tool index -> Anthropic block index
        self.tool_index = ToolIndex()
        self.finish_reason: str | None = None  # the upstream's, OpenAI's word
        self.usage: dict[str, Any] = {}

    def _start(self, chunk: Event) -> list[Event]:
        self.started = True
        msg_id = chunk.get("id") or "msg_reef"
        return [{"type": "message_start", "message": {
            "id": msg_id if msg_id.startswith("msg_") else f"msg_{msg_id}", "type": "message",
            "role": "assistant", "model": chunk.get("model", ""), "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}}]

    def _close(self) -> list[Event]:
        if self.block < 0 or self.block_kind is None:
            return []
        self.block_kind = None
        return [{"type": "content_block_stop", "index": self.block}]

    def _open(self, kind: str, block: dict[str, Any]) -> list[Event]:
        out = self._close()
        self.block += 1
        self.block_kind = kind
        out.append({"type": "content_block_start", "index": self.block, "content_block": block})
        return out

    def feed(self, chunk: Event) -> list[Event]:
        out: list[Event] = [] if self.started else self._start(chunk)
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                if self.block_kind != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out.append({"type": "content_block_delta", "index": self.block,
                            "delta": {"type": "text_delta", "text": text}})
            for tc in delta.get("tool_calls") or []:
                k = self.tool_index.of(tc)
                fn = tc.get("function") or {}
                if k not in self.tool_blocks:
                    out += self._open("tool_use", {"type": "tool_use", "id": tc.get("id") or f"toolu_{k}",
                                                   "name": fn.get("name", ""), "input": {}})
                    self.tool_blocks[k] = self.block
                if fn.get("arguments"):
                    out.append({"type": "content_block_delta", "index": self.tool_blocks[k],
                                "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]}})
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = [] if self.started else self._start({})
        out += self._close()
        usage = anthropic_usage(self.usage)
        stop = stop_reason(self.finish_reason, bool(self.tool_blocks))
        out.append({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage})
        out.append({"type": "message_stop"})
        return out


class WithId:
    """Another translator's events with the response's ``id`` set to ``response_id``: on every
    Chat Completions chunk, or on the message of Anthropic's ``message_start``. Reef puts the
    receipt there, so every client library that exposes the response id exposes the receipt."""

    def __init__(self, inner: Any, dialect: str, response_id: str):
        self.inner = inner
        self.dialect = dialect
        self.response_id = response_id

    def _set(self, events: list[Event]) -> list[Event]:
        rid = self.response_id
        if self.dialect == "openai":
            return [{**ev, "id": rid} if "id" in ev or "choices" in ev else ev for ev in events]
        return [{**ev, "message": {**(ev.get("message") or {}), "id": rid}}
                if ev.get("type") == "message_start" else ev for ev in events]

    def feed(self, event: Event) -> list[Event]:
        return self._set(self.inner.feed(event))

    def finish(self) -> list[Event]:
        return self._set(self.inner.finish())


class StreamError(Exception):
    """The upstream reported an error inside an already started stream."""


def stream_translator(source: str, target: str):
    """A translator from ``source`` (runtime) to ``target`` (client) stream events."""
    if source == target:
        return Passthrough()
    if source == "anthropic" and target == "openai":
        return AnthropicToOpenAI()
    if source == "openai" and target == "anthropic":
        return OpenAIToAnthropic()
    raise ValueError(f"cannot translate streams from {source!r} to {target!r}")


class StreamAssembler:
    """Folds client-dialect stream events into the equivalent non-streamed response body."""

    def __init__(self, dialect: str):
        self.dialect = dialect
        self.events = 0
        # OpenAI state
        self.base: dict[str, Any] = {}
        self.text: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.tool_index = ToolIndex()
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        # Anthropic state
        self.message: dict[str, Any] | None = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}

    def add(self, event: Event) -> None:
        self.events += 1
        if self.dialect == "openai":
            self._add_openai(event)
        else:
            self._add_anthropic(event)

    def _add_openai(self, chunk: Event) -> None:
        if not self.base:
            self.base = {"id": chunk.get("id", ""), "created": chunk.get("created", int(time.time())),
                         "model": chunk.get("model", "")}
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.text.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = self.tools.setdefault(self.tool_index.of(tc), {"id": "", "type": "function",
                                                                  "function": {"name": "", "arguments": ""}})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _add_anthropic(self, event: Event) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.message = dict(event.get("message") or {})
            self.message["content"] = []
        elif kind == "content_block_start":
            self.blocks[event.get("index", 0)] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            idx = event.get("index", 0)
            block = self.blocks.setdefault(idx, {"type": "text", "text": ""})
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif delta.get("type") == "input_json_delta":
                self.partial_json.setdefault(idx, []).append(delta.get("partial_json", ""))
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
        elif kind == "message_delta":
            if self.message is None:
                self.message = {"content": []}
            self.message.update({k: v for k, v in (event.get("delta") or {}).items()})
            usage = dict(self.message.get("usage") or {})
            usage.update(event.get("usage") or {})
            self.message["usage"] = usage

    def result(self) -> dict[str, Any]:
        """The assembled response body (partial when the stream did not finish)."""
        if self.dialect == "openai":
            message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) if self.text else None}
            if self.tools:
                message["tool_calls"] = [self.tools[k] for k in sorted(self.tools)]
            out = {"id": self.base.get("id", ""), "object": "chat.completion",
                   "created": self.base.get("created", int(time.time())), "model": self.base.get("model", ""),
                   "choices": [{"index": 0, "message": message, "logprobs": None,
                                "finish_reason": self.finish_reason}]}
            if self.usage:
                out["usage"] = self.usage
            return out
        msg = dict(self.message or {"type": "message", "role": "assistant"})
        content = []
        for idx in sorted(self.blocks):
            block = dict(self.blocks[idx])
            if block.get("type") == "tool_use" and idx in self.partial_json:
                raw = "".join(self.partial_json[idx])
                try:
                    block["input"] = jsonfast.loads(raw) if raw else {}
                except ValueError:
                    block["input"] = {"partial_json": raw}
            content.append(block)
        msg["content"] = content
        usage = msg.get("usage")
        if isinstance(usage, dict) and not any(usage.get(k) for k in ("input_tokens", "output_tokens")):
            # a stream cut before its message_delta, translated from Chat Completions: message_start
            # says 0 and 0 (the count comes at the end), which is no count at all; a record says none
            del msg["usage"]
        return msg
