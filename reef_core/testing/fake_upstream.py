"""A fake OpenAI- or Anthropic-speaking model server for tests.

    from reef_core.testing import FakeUpstream, Reply, ToolCall, system_prompt

    def responder(body):
        if "be terse" in system_prompt(body):
            return "ok"
        return Reply(text="Let me look.", tool_calls=[ToolCall("lookup", {"q": "x"})])

    with FakeUpstream("anthropic", responder) as up:
        ...  # point runtime.upstream_url at up.url, runtime.dialect at up.dialect

It serves ``POST /v1/chat/completions`` (dialect ``openai``) or ``POST /v1/messages``
(``anthropic``), streaming and not, and ``GET /v1/models``. Every request body is kept in
``up.requests``. Controls (each applies to the next ``times`` requests, then wears off):

- ``fail(status, message)`` — answer a provider-shaped error;
- ``hang()`` — hold requests until ``release()``, ``close()`` or ``seconds``;
- ``cut_stream(after_events)`` — break a stream's connection after that many events;
- ``end_stream_early(after_events)`` — end a stream cleanly but without its final event;
- ``stall_stream(after_events)`` — stop sending after that many events until ``release()``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .replies import Reply, Responder, echo, prompt_tokens
from .servers import ServerThread

_FINISH = {"end": "stop", "length": "length", "tool": "tool_calls"}
_STOP = {"end": "end_turn", "length": "max_tokens", "tool": "tool_use"}


class StreamCut(Exception):
    """Raised inside the fake's stream to drop the connection mid-way."""


@dataclass
class _Control:
    kind: str
    times: int | None  # None: every request until reset()
    status: int = 500
    message: str = ""
    after_events: int = 0
    seconds: float | None = None


class FakeUpstream:
    """A model server on ``127.0.0.1:<random port>`` whose answers come from ``responder``.
    ``server_options`` are further ``uvicorn.Config`` settings: ``ssl_certfile`` and
    ``ssl_keyfile`` (and ``ssl_ca_certs`` with ``ssl_cert_reqs``) serve it over ``https``."""

    def __init__(self, dialect: str = "openai", responder: Responder | None = None, *,
                 model: str = "fake-model", api_key: str | None = None, words_per_chunk: int = 1,
                 server_options: dict[str, Any] | None = None):
        if dialect not in ("openai", "anthropic"):
            raise ValueError("dialect must be 'openai' or 'anthropic'")
        self.dialect = dialect
        self.responder = responder or echo
        self.model = model
        self.api_key = api_key
        self.words_per_chunk = max(1, words_per_chunk)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._controls: list[_Control] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._ids = itertools.count(1)
        self._server = ServerThread(self._app(), log_level="critical", graceful_s=1, options=server_options)

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """Base URL (``http://127.0.0.1:<port>``, or ``https``); Reef's ``runtime.upstream_url``."""
        return self._server.url

    def start(self) -> FakeUpstream:
        self._server.start()
        return self

    def close(self) -> None:
        self._released.set()
        self._server.stop()

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ controls

    def _add(self, control: _Control) -> None:
        with self._lock:
            self._controls.append(control)

    def fail(self, status: int = 500, message: str = "fake upstream failure", *, times: int | None = 1) -> None:
        """Answer the next ``times`` requests (None: all) with a provider-shaped error."""
        self._add(_Control("fail", times, status=status, message=message))

    def hang(self, seconds: float | None = None, *, times: int | None = 1) -> None:
        """Hold the next requests before answering, until ``release()`` or ``seconds`` pass."""
        self._released.clear()
        self._add(_Control("hang", times, seconds=seconds))

    def release(self) -> None:
        """Let hung requests go on."""
        self._released.set()

    def cut_stream(self, after_events: int = 2, *, times: int | None = 1) -> None:
        """Drop the connection of the next streams after ``after_events`` events."""
        self._add(_Control("cut", times, after_events=after_events))

    def end_stream_early(self, after_events: int = 2, *, times: int | None = 1) -> None:
        """End the next streams cleanly after ``after_events`` events, without the final event."""
        self._add(_Control("end_early", times, after_events=after_events))

    def stall_stream(self, after_events: int = 2, *, times: int | None = 1) -> None:
        """Stall the next streams after ``after_events`` events until ``release()`` or ``close()``."""
        self._released.clear()
        self._add(_Control("stall", times, after_events=after_events))

    def reset(self) -> None:
        """Forget controls and recorded requests."""
        with self._lock:
            self._controls.clear()
            self.requests.clear()
            self.headers.clear()
        self._released.set()

    def _take(self, kinds: tuple[str, ...]) -> _Control | None:
        with self._lock:
            for c in self._controls:
                if c.kind in kinds:
                    if c.times is not None:
                        c.times -= 1
                        if c.times <= 0:
                            self._controls.remove(c)
                    return c
        return None

    # ------------------------------------------------------------------ the app

    def _app(self) -> Starlette:
        path = "/v1/chat/completions" if self.dialect == "openai" else "/v1/messages"
        return Starlette(routes=[Route(path, self._handle, methods=["POST"]),
                                 Route("/v1/models", self._models, methods=["GET"])])

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    def _error(self, status: int, message: str) -> Response:
        if self.dialect == "openai":
            body = {"error": {"message": message, "type": "api_error" if status >= 500 else "invalid_request_error",
                              "param": None, "code": None}}
        else:
            body = {"type": "error", "error": {"type": "api_error" if status >= 500 else "invalid_request_error",
                                               "message": message}}
        return JSONResponse(body, status_code=status)

    async def _handle(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return self._error(400, "fake upstream: body is not JSON")
        with self._lock:
            self.requests.append(body)
            self.headers.append(dict(request.headers))
        if self.api_key is not None:
            presented = request.headers.get("x-api-key") or request.headers.get("authorization", "")[7:]
            if presented != self.api_key:
                return self._error(401, "fake upstream: invalid api key")
        hang = self._take(("hang",))
        if hang is not None:
            deadline = None if hang.seconds is None else time.monotonic() + hang.seconds
            while not self._released.is_set() and (deadline is None or time.monotonic() < deadline):
                await asyncio.sleep(0.02)
        failure = self._take(("fail",))
        if failure is not None:
            return self._error(failure.status, failure.message)
        if not isinstance(body, dict):
            return self._error(400, "fake upstream: the body must be a JSON object")
        try:
            reply = self.responder(body)
        except Exception as exc:  # a responder bug must be visible, not a bare 500
            return self._error(500, f"fake upstream responder failed: {type(exc).__name__}: {exc}")
        if isinstance(reply, str):
            reply = Reply(text=reply)
        reply.input_tokens = reply.input_tokens if reply.input_tokens is not None else prompt_tokens(body)
        reply.output_tokens = reply.output_tokens if reply.output_tokens is not None else \
            max(len(reply.text.split()) + 5 * len(reply.tool_calls), 1)
        model = body.get("model") or self.model
        n = next(self._ids)
        if not body.get("stream"):
            make = self._openai_body if self.dialect == "openai" else self._anthropic_body
            return JSONResponse(make(reply, model, n))
        control = self._take(("cut", "end_early", "stall"))
        events = self._openai_events(reply, model, n, body) if self.dialect == "openai" \
            else self._anthropic_events(reply, model, n)
        return StreamingResponse(self._sse(events, control), media_type="text/event-stream")

    async def _sse(self, events: list[tuple[str | None, Any]], control: _Control | None) -> AsyncIterator[bytes]:
        for i, (name, data) in enumerate(events):
            if control is not None and i == control.after_events:
                if control.kind == "cut":
                    raise StreamCut("fake upstream cut the stream")
                if control.kind == "end_early":
                    return
                while not self._released.is_set():
                    await asyncio.sleep(0.02)
            payload = data if isinstance(data, str) else json.dumps(data)
            yield (f"event: {name}\n" if name else "").encode() + f"data: {payload}\n\n".encode()
            await asyncio.sleep(0)

    def _chunks(self, text: str) -> list[str]:
        words = text.split(" ")
        k = self.words_per_chunk
        pieces = [" ".join(words[i:i + k]) for i in range(0, len(words), k)]
        return [p + (" " if i < len(pieces) - 1 else "") for i, p in enumerate(pieces)] if text else []

    # ------------------------------------------------------------------ OpenAI shapes

    def _openai_body(self, reply: Reply, model: str, n: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_calls:
            message["tool_calls"] = [{"id": tc.id, "type": "function",
                                      "function": {"name": tc.name, "arguments": json.dumps(tc.arguments)}}
                                     for tc in reply.tool_calls]
        return {"id": f"chatcmpl-fake-{n}", "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [{"index": 0, "message": message, "logprobs": None,
                                             "finish_reason": _FINISH[reply.stop_kind]}],
                "usage": {"prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens,
                          "total_tokens": reply.input_tokens + reply.output_tokens}}

    def _openai_events(self, reply: Reply, model: str, n: int, body: dict[str, Any]) -> list[tuple[None, Any]]:
        base = {"id": f"chatcmpl-fake-{n}", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": model}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[None, Any]:
            return None, {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

        out = [chunk({"role": "assistant", "content": ""})]
        out += [chunk({"content": piece}) for piece in self._chunks(reply.text)]
        for i, tc in enumerate(reply.tool_calls):
            args = json.dumps(tc.arguments)
            half = len(args) // 2
            out.append(chunk({"tool_calls": [{"index": i, "id": tc.id, "type": "function",
                                              "function": {"name": tc.name, "arguments": ""}}]}))
            out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[:half]}}]}))
            out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]}))
        out.append(chunk({}, _FINISH[reply.stop_kind]))
        if (body.get("stream_options") or {}).get("include_usage"):
            out.append((None, {**base, "choices": [], "usage": {
                "prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens,
                "total_tokens": reply.input_tokens + reply.output_tokens}}))
        out.append((None, "[DONE]"))
        return out

    # ------------------------------------------------------------------ Anthropic shapes

    def _anthropic_body(self, reply: Reply, model: str, n: int) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
        content += [{"type": "tool_use", "id": tc.id, "name": tc.name, "input": tc.arguments}
                    for tc in reply.tool_calls]
        return {"id": f"msg_fake_{n}", "type": "message", "role": "assistant", "model": model, "content": content,
                "stop_reason": _STOP[reply.stop_kind], "stop_sequence": None,
                "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens}}

    def _anthropic_events(self, reply: Reply, model: str, n: int) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = [("message_start", {"type": "message_start", "message": {
            "id": f"msg_fake_{n}", "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": reply.input_tokens, "output_tokens": 1}}}), ("ping", {"type": "ping"})]
        index = 0
        if reply.text:
            out.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                 "content_block": {"type": "text", "text": ""}}))
            out += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": {"type": "text_delta", "text": piece}})
                    for piece in self._chunks(reply.text)]
            out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
        for tc in reply.tool_calls:
            args = json.dumps(tc.arguments)
            half = len(args) // 2
            out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": tc.id, "name": tc.name, "input": {}}}))
            for part in (args[:half], args[half:]):
                out.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "input_json_delta", "partial_json": part}}))
            out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
            index += 1
        out.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": _STOP[reply.stop_kind],
                                                                         "stop_sequence": None},
                                      "usage": {"output_tokens": reply.output_tokens}}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out
