"""A fake OpenAI Responses API server for tests (``runtime.dialect: responses``).

    from reef_core.testing import FakeResponsesUpstream, responses_items as items

    def responder(body):   # the request body as it reached the upstream
        return [items.reasoning("thought about it"), items.web_search("reef"), items.message("Done.")]

    with FakeResponsesUpstream(responder) as up:
        ...  # runtime.upstream_url at up.url, runtime.dialect: responses
        up.requests[-1]   # what reached the upstream, as it came

It serves ``POST /v1/responses`` (whole or streamed, with the event sequence OpenAI sends:
``response.created`` … per output item ``output_item.added``, its deltas, ``output_item.done``
… ``response.completed``), ``GET /v1/responses/{id}`` (what it stored: answers to requests
without ``store: false``), and ``GET /v1/models``. A ``previous_response_id`` that it did not
store is a 400, as at OpenAI. Every request body is kept in ``up.requests``. Controls for the
next stream: ``fail_stream(message)`` ends it with ``response.failed``; ``cut_stream(after_events)``
drops the connection after that many events.

The responder returns output items (build them with ``responses_items``), or a ``Reply`` or a
string (a message, then the reply's function calls). The default answers like the real
service does for a reasoning model asked anything: a reasoning item with an encrypted
``encrypted_content``, then a message echoing the last user text.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import responses_items as items
from .replies import Reply
from .servers import ServerThread

Output = list[dict[str, Any]]
ResponsesResponder = Callable[[dict[str, Any]], "Output | Reply | str"]


def last_input_text(body: dict[str, Any]) -> str:
    """The text of the last user message in a Responses body (``input`` as a string or items)."""
    value = body.get("input")
    if isinstance(value, str):
        return value
    for item in reversed(value if isinstance(value, list) else []):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            return "\n".join(str(p.get("text", "")) for p in content or [] if isinstance(p, dict))
    return ""


def default_responder(body: dict[str, Any]) -> Output:
    return [items.reasoning("Considering the request."), items.message(f"echo: {last_input_text(body)}")]


class FakeResponsesUpstream:
    """An OpenAI Responses server on ``127.0.0.1:<random port>`` whose output comes from ``responder``."""

    dialect = "responses"

    def __init__(self, responder: ResponsesResponder | None = None, *, model: str = "gpt-5-fake",
                 words_per_chunk: int = 1):
        self.responder = responder or default_responder
        self.model = model
        self.words_per_chunk = max(1, words_per_chunk)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.stored: dict[str, dict[str, Any]] = {}
        self.retrieved: list[str] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._fail_message: str | None = None
        self._cut_after: int | None = None
        self._server = ServerThread(Starlette(routes=[
            Route("/v1/responses", self._create, methods=["POST"]),
            Route("/v1/responses/{response_id}", self._retrieve, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]), log_level="critical", graceful_s=1)

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> FakeResponsesUpstream:
        self._server.start()
        return self

    def close(self) -> None:
        self._server.stop()

    def __enter__(self) -> FakeResponsesUpstream:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def fail_stream(self, message: str = "fake upstream failure") -> None:
        """End the next stream with ``response.failed`` carrying ``message``."""
        self._fail_message = message

    def cut_stream(self, after_events: int = 3) -> None:
        """Drop the next stream's connection after ``after_events`` events."""
        self._cut_after = after_events

    # ------------------------------------------------------------------ routes

    @staticmethod
    def _error(status: int, message: str, param: str | None = None) -> Response:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                       "code": None}}, status_code=status)

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _retrieve(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        self.retrieved.append(response_id)
        stored = self.stored.get(response_id)
        if stored is None:
            return self._error(404, f"No response found with id '{response_id}'.")
        return JSONResponse(stored)

    async def _create(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return self._error(400, "fake upstream: body is not JSON")
        if not isinstance(body, dict):
            return self._error(400, "fake upstream: the body must be a JSON object")
        with self._lock:
            self.requests.append(body)
            self.headers.append(dict(request.headers))
        previous = body.get("previous_response_id")
        if previous and previous not in self.stored:
            return self._error(400, f"Previous response with id '{previous}' not found.", "previous_response_id")
        try:
            output = self._output(self.responder(body))
        except Exception as exc:  # a responder bug must be visible, not a bare 500
            return self._error(500, f"fake upstream responder failed: {type(exc).__name__}: {exc}")
        response = self._response(body, f"resp_fake_{next(self._ids)}", output)
        if body.get("store") is not False:
            self.stored[response["id"]] = response
        if not body.get("stream"):
            return JSONResponse(response)
        events = self._events(response)
        with self._lock:
            failure, self._fail_message = self._fail_message, None
            cut, self._cut_after = self._cut_after, None
        if failure is not None:
            failed = {**response, "status": "failed", "error": {"code": "server_error", "message": failure}}
            events[-1] = {"type": "response.failed", "sequence_number": events[-1]["sequence_number"],
                          "response": failed}
        return StreamingResponse(self._sse(events, cut), media_type="text/event-stream")

    # ------------------------------------------------------------------ shapes

    @staticmethod
    def _output(answer: Output | Reply | str) -> Output:
        if isinstance(answer, list):
            return [dict(i) for i in answer]
        reply = Reply(text=answer) if isinstance(answer, str) else answer
        out = [items.message(reply.text)] if reply.text else []
        return out + [items.function_call(tc.name, tc.arguments, call_id=tc.id) for tc in reply.tool_calls]

    def _response(self, body: dict[str, Any], response_id: str, output: Output) -> dict[str, Any]:
        words = len(json.dumps(body.get("input")).split()) + len(str(body.get("instructions") or "").split())
        out_words = sum(len(json.dumps(i).split()) for i in output)
        reasoning = sum(1 for i in output if i.get("type") == "reasoning") * 16
        return {"id": response_id, "object": "response", "created_at": int(time.time()), "status": "completed",
                "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
                "model": body.get("model") or self.model, "output": output,
                "parallel_tool_calls": body.get("parallel_tool_calls", True),
                "previous_response_id": body.get("previous_response_id"), "reasoning": body.get("reasoning") or {},
                "store": body.get("store", True) is not False, "temperature": body.get("temperature"),
                "text": body.get("text") or {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice", "auto"),
                "tools": body.get("tools") or [], "top_p": body.get("top_p"), "truncation": "disabled",
                "metadata": body.get("metadata") or {},
                "usage": {"input_tokens": max(words, 1), "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens": out_words + reasoning,
                          "output_tokens_details": {"reasoning_tokens": reasoning},
                          "total_tokens": max(words, 1) + out_words + reasoning}}

    def _pieces(self, text: str) -> list[str]:
        words = text.split(" ")
        k = self.words_per_chunk
        pieces = [" ".join(words[i:i + k]) for i in range(0, len(words), k)]
        return [p + (" " if i < len(pieces) - 1 else "") for i, p in enumerate(pieces)] if text else []

    def _events(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """The event sequence OpenAI streams for ``response``."""
        events: list[dict[str, Any]] = []

        def ev(kind: str, **fields: Any) -> None:
            events.append({"type": kind, "sequence_number": len(events), **fields})

        start = {**response, "status": "in_progress", "output": [], "usage": None}
        ev("response.created", response=start)
        ev("response.in_progress", response=start)
        for n, item in enumerate(response["output"]):
            kind, item_id = item.get("type"), item.get("id")
            if kind == "message":
                ev("response.output_item.added", output_index=n, item={**item, "status": "in_progress", "content": []})
                text = "".join(p.get("text", "") for p in item.get("content") or [])
                ev("response.content_part.added", item_id=item_id, output_index=n, content_index=0,
                   part={"type": "output_text", "text": "", "annotations": []})
                for piece in self._pieces(text):
                    ev("response.output_text.delta", item_id=item_id, output_index=n, content_index=0, delta=piece,
                       logprobs=[])
                ev("response.output_text.done", item_id=item_id, output_index=n, content_index=0, text=text,
                   logprobs=[])
                ev("response.content_part.done", item_id=item_id, output_index=n, content_index=0,
                   part={"type": "output_text", "text": text, "annotations": []})
            elif kind == "reasoning":
                ev("response.output_item.added", output_index=n,
                   item={"type": "reasoning", "id": item_id, "summary": []})
                for k, part in enumerate(item.get("summary") or []):
                    ev("response.reasoning_summary_part.added", item_id=item_id, output_index=n, summary_index=k,
                       part={"type": "summary_text", "text": ""})
                    ev("response.reasoning_summary_text.delta", item_id=item_id, output_index=n, summary_index=k,
                       delta=part["text"])
                    ev("response.reasoning_summary_text.done", item_id=item_id, output_index=n, summary_index=k,
                       text=part["text"])
                    ev("response.reasoning_summary_part.done", item_id=item_id, output_index=n, summary_index=k,
                       part=part)
            elif kind == "function_call":
                ev("response.output_item.added", output_index=n, item={**item, "arguments": "", "status": "in_progress"})
                args = item["arguments"]
                for piece in (args[:len(args) // 2], args[len(args) // 2:]):
                    ev("response.function_call_arguments.delta", item_id=item_id, output_index=n, delta=piece)
                ev("response.function_call_arguments.done", item_id=item_id, output_index=n, arguments=args)
            elif kind == "custom_tool_call":
                ev("response.output_item.added", output_index=n, item={**item, "input": ""})
                ev("response.custom_tool_call_input.delta", item_id=item_id, output_index=n, delta=item["input"])
                ev("response.custom_tool_call_input.done", item_id=item_id, output_index=n, input=item["input"])
            elif kind == "web_search_call":
                ev("response.output_item.added", output_index=n, item={**item, "status": "in_progress"})
                for phase in ("in_progress", "searching", "completed"):
                    ev(f"response.web_search_call.{phase}", item_id=item_id, output_index=n)
            else:
                ev("response.output_item.added", output_index=n, item=item)
            ev("response.output_item.done", output_index=n, item=item)
        ev("response.completed", response=response)
        return events

    @staticmethod
    async def _sse(events: list[dict[str, Any]], cut: int | None = None) -> AsyncIterator[bytes]:
        for n, event in enumerate(events):
            if n == cut:
                raise ConnectionResetError("fake upstream cut the stream")
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
