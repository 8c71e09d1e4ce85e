"""An upstream fault injector and a concurrent load that judges Reef's answers to it.

``FaultUpstream`` speaks both dialects (``/v1/chat/completions`` and ``/v1/messages``) and picks
a fault per request from the request itself: the text ``fault:<name>`` anywhere in the body
(Reef forwards the user's text in either dialect, so the client chooses the fault and knows
what to expect). Faults:

- ``ok``, ``drip`` (slow but steady: every pause shorter than Reef's ``runtime.timeout_s``),
  ``huge`` (a ``huge_bytes`` answer): a normal answer;
- ``e500``, ``e503``, ``e429``: a provider-shaped error whose message says ``fault-injected``;
- ``hang``: nothing for ``hang_s`` (set Reef's ``runtime.timeout_s`` below it);
- ``stall``: part of the answer, then nothing for ``hang_s``;
- ``cut``: part of the answer, then the connection is dropped;
- ``no_terminal``: a stream that ends cleanly without ``[DONE]``/``message_stop`` (a body cut
  short, when not streamed);
- ``deep``: a well-formed answer carrying a value nested ``deep`` levels;
- ``malformed``: JSON that does not parse; ``html``: a 200 ``text/html`` page; ``empty``: a 200
  with no body.

``EXPECT`` says what Reef may answer to each fault (HTTP status and the record's status);
``fire``/``run_load`` send ``Shot``s concurrently and ``verify_receipts`` reads back every
record a receipt was given for. Used by ``test_fault_injection.py`` and ``bench/soak.py``.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from inputs import (
    BOUND_S,
    JSON_HEADERS,
    ROUTE_PATHS,
    Answer,
    BadShape,
    Deep,
    Dropped,
    Hang,
    Lost,
    Req,
    ServerError,
    all_pages,
    get_record,
    judge,
    send,
    stream_end,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from reef_core.testing import ServerThread

FAULTS = ["ok", "drip", "huge", "e500", "e503", "e429", "hang", "stall", "cut", "no_terminal", "deep", "malformed",
          "html", "empty"]
_FAULT_RE = re.compile(rb"fault:([a-z0-9_]+)")

# What Reef may answer: {(HTTP status, record status)} per fault, not streamed / streamed.
# 502/504 are Reef's documented upstream errors; 500/503/429 only when relayed from the fault.
OK, INCOMPLETE = (200, "ok"), (200, "incomplete")
E502, E504 = (502, "error"), (504, "error")
EXPECT: dict[str, tuple[set, set]] = {
    "ok": ({OK}, {OK}),
    "drip": ({OK}, {OK}),
    "huge": ({OK, E502}, {OK, INCOMPLETE, E502}),
    "e500": ({(500, "error")}, {(500, "error")}),
    "e503": ({(503, "error")}, {(503, "error")}),
    "e429": ({(429, "error")}, {(429, "error")}),
    "hang": ({E502, E504}, {E502, E504}),
    "stall": ({E502, E504}, {INCOMPLETE, E502, E504}),
    "cut": ({E502}, {INCOMPLETE, E502}),
    "no_terminal": ({E502}, {INCOMPLETE, E502}),
    "deep": ({OK, E502}, {OK, INCOMPLETE, E502}),
    "malformed": ({E502}, {INCOMPLETE, E502}),
    "html": ({E502}, {INCOMPLETE, E502}),
    "empty": ({E502}, {INCOMPLETE, E502}),
}


class StreamCut(Exception):
    """Raised inside a response body to drop the connection mid-way."""


class FaultUpstream:
    """A model server on ``127.0.0.1:<random port>`` that misbehaves on request."""

    def __init__(self, *, hang_s: float = 3.0, huge_bytes: int = 1 << 20, drip_s: float = 0.05, deep: int = 1000):
        self.hang_s = hang_s
        self.huge_bytes = huge_bytes
        self.drip_s = drip_s
        self.deep = deep
        self.injected: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._ids = 0
        self._server = ServerThread(Starlette(routes=[
            Route("/v1/chat/completions", self._handle, methods=["POST"]),
            Route("/v1/messages", self._handle, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]), log_level="critical", graceful_s=1)

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> FaultUpstream:
        self._server.start()
        return self

    def close(self) -> None:
        self._server.stop()

    def __enter__(self) -> FaultUpstream:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ answers

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "fault-model", "object": "model"}]})

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        match = _FAULT_RE.search(raw)
        fault = match.group(1).decode() if match else "ok"
        fault = fault if fault in EXPECT else "ok"
        dialect = "openai" if request.url.path.endswith("/chat/completions") else "anthropic"
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = {}
        streamed = isinstance(body, dict) and body.get("stream") is True
        with self._lock:
            self.injected[fault] += 1
            self._ids += 1
            n = self._ids
        text = "x" * self.huge_bytes if fault == "huge" else f"answer {n} to {fault}"
        if fault.startswith("e") and fault[1:].isdigit():
            return self._error(dialect, int(fault[1:]))
        if fault == "hang":
            await asyncio.sleep(self.hang_s)
        if fault == "html":
            return Response(b"<html><body><h1>502 Bad Gateway</h1></body></html>", media_type="text/html")
        if fault == "empty":
            return Response(b"", media_type="text/event-stream" if streamed else "application/json")
        if not streamed:
            return self._complete(dialect, fault, n, text)
        events = self._events(dialect, n, text, body)
        if fault == "no_terminal":
            events = events[:-1]
        elif fault == "malformed":
            events = [b"data: {not json\n\n", *events]
        elif fault == "deep":
            events.insert(1, self._sse(dialect, {"type": "ping", "id": "x", "choices": [],
                                                 "x": Deep(self.deep)}, raw=True))
        return StreamingResponse(self._play(events, fault), media_type="text/event-stream")

    def _error(self, dialect: str, status: int) -> Response:
        message = f"fault-injected {status}"
        if dialect == "openai":
            body = {"error": {"message": message, "type": "api_error", "param": None, "code": None}}
        else:
            body = {"type": "error", "error": {"type": "api_error", "message": message}}
        return JSONResponse(body, status_code=status)

    def _complete(self, dialect: str, fault: str, n: int, text: str) -> Response:
        if dialect == "openai":
            body = {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1, "model": "fault-model",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
        else:
            body = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": "fault-model",
                    "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
                    "usage": {"input_tokens": 3, "output_tokens": 4}}
        data = json.dumps(body).encode()
        if fault == "deep":
            data = data[:-1] + b',"x":' + Deep(self.deep).encode() + b"}"
        elif fault == "malformed":
            data = data[: len(data) // 2]
        elif fault == "no_terminal":
            return Response(data[: len(data) // 2], media_type="application/json")
        if fault in ("drip", "stall", "cut"):
            size = max(1, len(data) // 8)
            pieces = [data[i:i + size] for i in range(0, len(data), size)]
            return StreamingResponse(self._play(pieces, fault), media_type="application/json",
                                     headers={"content-length": str(len(data))})
        return Response(data, media_type="application/json")

    def _sse(self, dialect: str, event: dict[str, Any], raw: bool = False) -> bytes:
        data = ("{" + ",".join(f"{json.dumps(k)}:{v if isinstance(v, Deep) else json.dumps(v)}"
                               for k, v in event.items()) + "}") if raw else json.dumps(event)
        name = f"event: {event.get('type', 'message')}\n" if dialect == "anthropic" else ""
        return f"{name}data: {data}\n\n".encode()

    def _events(self, dialect: str, n: int, text: str, body: dict[str, Any]) -> list[bytes]:
        pieces = [text[i:i + 65536] for i in range(0, len(text), 65536)] or [""]
        if dialect == "openai":
            base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 1, "model": "fault-model"}
            out = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None}]}]
            out += [{**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
            out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            if isinstance(body.get("stream_options"), dict) and body["stream_options"].get("include_usage"):
                out.append({**base, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4,
                                                             "total_tokens": 7}})
            return [self._sse(dialect, e) for e in out] + [b"data: [DONE]\n\n"]
        out = [{"type": "message_start", "message": {"id": f"msg_{n}", "type": "message", "role": "assistant",
                                                      "model": "fault-model", "content": [], "stop_reason": None,
                                                      "stop_sequence": None,
                                                      "usage": {"input_tokens": 3, "output_tokens": 1}}},
               {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]
        out += [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
                for p in pieces]
        out += [{"type": "content_block_stop", "index": 0},
                {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                 "usage": {"output_tokens": 4}},
                {"type": "message_stop"}]
        return [self._sse(dialect, e) for e in out]

    async def _play(self, pieces: list[bytes], fault: str) -> AsyncIterator[bytes]:
        half = max(1, len(pieces) // 2)
        for i, piece in enumerate(pieces):
            if i == half and fault == "cut":
                raise StreamCut("fault injector cut the connection")
            if i == half and fault == "stall":
                await asyncio.sleep(self.hang_s)
            if fault == "drip" and i:
                await asyncio.sleep(self.drip_s)
            yield piece


# ---------------------------------------------------------------------------- the load


@dataclass
class Shot:
    """One inference request of the load: client dialect, streamed or not, fault, scenario."""

    n: int
    route: str
    stream: bool
    fault: str
    scenario: str

    def req(self) -> Req:
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": f"fault:{self.fault} #{self.n}"}]}
        if self.route == "anthropic":
            body["max_tokens"] = 64
        if self.stream:
            body["stream"] = True
        return Req("POST", ROUTE_PATHS[self.route], [*JSON_HEADERS, (b"x-reef-scenario", self.scenario.encode())],
                   json.dumps(body).encode(), stream=self.stream, scenario=self.scenario, kind="chat")


@dataclass
class Result:
    shot: Shot
    status: int | None = None
    record_status: str | None = None  # what the record must say: ok | incomplete | error
    receipt: str | None = None
    problem: str | None = None  # hang | dropped | writer_died | reef_5xx | unexpected | shape | lost
    detail: str = ""
    seconds: float = 0.0


def plan(seed: int, n: int, *, scenarios: list[str], healthy_share: float = 0.4,
         faults: list[str] | None = None) -> list[Shot]:
    """``n`` shots, seeded: ``healthy_share`` of them plain ``ok``, the rest spread over faults."""
    rng = random.Random(seed)
    faults = [f for f in (faults or FAULTS) if f != "ok"]
    return [Shot(i, rng.choice(["openai", "anthropic"]), rng.random() < 0.5,
                 "ok" if rng.random() < healthy_share else rng.choice(faults), rng.choice(scenarios))
            for i in range(n)]


def relayed(fault: str, answer: Answer) -> bool:
    """A 5xx Reef may answer for ``fault``: its documented upstream errors (502, 504) for a
    faulty upstream, or the status the fault told the upstream to send, relayed."""
    if fault in ("ok", "drip"):
        return False
    if answer.status in (502, 504):
        return True
    return fault == f"e{answer.status}" and b"fault-injected" in answer.body


def record_status_of(answer: Answer) -> str:
    if answer.status != 200:
        return "error"
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        return "ok" if stream_end(answer) == "ok" else "incomplete"
    return "ok"


def fire(client: httpx.Client, shot: Shot, *, bound: float = BOUND_S) -> Result:
    req = shot.req()
    result = Result(shot)
    try:
        answer = send(client, req, bound=bound)
    except Hang as exc:
        result.problem, result.detail = "dropped" if isinstance(exc, Dropped) else "hang", str(exc)
        return result
    result.status, result.receipt, result.seconds = answer.status, answer.receipt, answer.seconds
    result.record_status = record_status_of(answer)
    try:
        judge(req, answer, upstream_failed=lambda a: relayed(shot.fault, a))
    except ServerError as exc:
        result.problem, result.detail = "reef_5xx", str(exc)
        return result
    except BadShape as exc:
        result.problem, result.detail = "shape", str(exc)
        return result
    allowed = EXPECT[shot.fault][shot.stream]
    if (answer.status, result.record_status) not in allowed:
        result.problem = "unexpected"
        result.detail = (f"fault {shot.fault} (stream={shot.stream}) answered {answer.status}/{result.record_status}, "
                         f"expected one of {sorted(allowed)}: {answer.body[:200]!r}")
    elif answer.status in (200, 502, 504, 500, 503, 429) and not answer.receipt:
        result.problem, result.detail = "shape", f"no receipt on a {answer.status} inference answer: {req!r}"
    return result


def run_load(url: str, shots: list[Shot], *, concurrency: int, bound: float = BOUND_S,
             headers: dict[str, str] | None = None, alive: Callable[[], bool] | None = None) -> list[Result]:
    """Fire every shot, ``concurrency`` at a time, each worker on its own keep-alive client.
    ``alive`` (the record writer's liveness, for an in-process server): once it says no, the
    remaining shots are not sent (each would hang) but marked ``writer_died``."""
    local = threading.local()
    clients: list[httpx.Client] = []
    lock = threading.Lock()

    def one(shot: Shot) -> Result:
        if alive is not None and not alive():
            return Result(shot, problem="writer_died", detail="the record writer thread is dead")
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=url, headers=headers or {}, timeout=bound)
            with lock:
                clients.append(client)
        return fire(client, shot, bound=bound)

    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="load") as pool:
            return list(pool.map(one, shots))
    finally:
        for c in clients:
            c.close()


def verify_receipts(client: httpx.Client, results: list[Result], *, wait_s: float = 5.0) -> list[Result]:
    """Every answer that carried a receipt has a readable record with the right status, by id
    and in its scenario's pages. Marks and returns the results whose record is lost."""
    lost = []
    by_scenario: dict[str, set[str]] = {}
    for r in results:
        if not r.receipt or r.problem:
            continue
        try:
            record = get_record(client, r.receipt, wait_s=wait_s)
            if record.get("status") != r.record_status:
                raise Lost(f"record {r.receipt} has status {record.get('status')!r}, expected {r.record_status!r}")
        except (Lost, Hang) as exc:
            r.problem, r.detail = "lost", str(exc)
            lost.append(r)
            continue
        by_scenario.setdefault(r.shot.scenario, set()).add(r.receipt)
    for scenario, receipts in by_scenario.items():
        try:
            listed = {rec["id"] for rec in all_pages(client, scenario, [("limit", "100")], max_pages=10_000)}
        except (Lost, Hang) as exc:
            listed, why = set(), str(exc)
        else:
            why = "missing from its scenario's pages"
        for r in results:
            if r.receipt in receipts and r.receipt not in listed:
                r.problem, r.detail = "lost", f"record {r.receipt}: {why}"
                lost.append(r)
    return lost


def summarize(results: list[Result]) -> Counter[str]:
    return Counter(r.problem for r in results if r.problem)


def wait_ready(client: httpx.Client, bound: float = BOUND_S) -> tuple[int, int]:
    """(/healthz status, /readyz status), each within the bound."""
    deadline = time.monotonic() + bound
    statuses = []
    for path in ("/healthz", "/readyz"):
        statuses.append(client.get(path, timeout=max(0.1, deadline - time.monotonic())).status_code)
    return statuses[0], statuses[1]
