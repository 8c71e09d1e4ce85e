"""The inference path: freeze the release, allocate the receipt, call the runtime, record.

One ``Exchange`` per request carries what the record needs. Non-streamed answers return
only after the record is durable (the group-commit writer). Streams relay events as they
arrive, hold back the terminal event until the record is durable, and attach
``{"reef": {"agent_record_id", "release_id"}}`` to it; a stream that breaks on either side
still leaves a record, marked ``incomplete``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import anyio
from sqlalchemy.orm import configure_mappers, instrumentation
from starlette.responses import Response, StreamingResponse

from ..errors import RuntimeCallError
from ..store import Record
from ..types import ActiveRelease, InferenceCall, base_release
from . import jsonfast
from .dialects import (
    TERMINAL_EVENTS,
    is_usage_chunk,
    stream_assembler,
    stream_translator,
    translate_request,
    translate_response,
    usage_summary,
)
from .errors import error_body, error_response, upstream_error_response
from .state import ServeState

log = logging.getLogger("reef.serve")

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@dataclass
class Exchange:
    """One inference request as the record will keep it."""

    route: str  # openai.chat | anthropic.messages | openai.responses
    dialect: str  # the client's dialect: openai | anthropic | responses
    scenario: str
    session: str | None
    tags: dict[str, str] | None
    record_id: str
    release: ActiveRelease | None
    body: dict[str, Any]  # client body after prepare_body (what is recorded)
    stream: bool
    #: ``server.max_json_depth``: a response nested deeper is not stored (it could not be read back)
    max_json_depth: int = 64
    started: float = field(default_factory=time.perf_counter)
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def release_id(self) -> str | None:
        return self.release.release_id if self.release is not None else None

    def headers(self, *, recorded: bool = True) -> dict[str, str]:
        """The answer's Reef headers; the receipt only when its record was stored (``recorded``)."""
        h = {"x-reef-agent-record-id": self.record_id} if recorded else {}
        if self.release is not None:
            h["x-reef-release-id"] = self.release.release_id
        return h

    def record(self, call: InferenceCall | None, runtime: str, *, status: str, response: Any = None,
               error: str | None = None) -> Record:
        extras = call.extras if call is not None else {}
        if response is not None and jsonfast.nesting_depth(response, self.max_json_depth) > self.max_json_depth:
            # Whatever is stored must be readable back; the answer itself already went out.
            response = None
            status = "error" if status == "ok" else status
            error = (f"{error}; " if error else "") + (f"the answer nests more than {self.max_json_depth} levels "
                                                       f"deep (server.max_json_depth), so it was not stored")
        model = response.get("model") if isinstance(response, dict) and response.get("model") else None
        if model is None and call is not None:
            model = call.body.get("model")
        return _new_record(
            id=self.record_id, scenario=self.scenario, kind="inference", session=self.session, tags=self.tags,
            created_at=self.created_at, finished_at=datetime.now(timezone.utc), release_id=self.release_id,
            runtime=runtime, model=_text_column(model), route=self.route,
            request=self.body, response=response, status=status, error=error,
            latency_ms=(time.perf_counter() - self.started) * 1000.0,
            usage=usage_summary(response, self.dialect),
            prompt_token_ids=extras.get("prompt_token_ids"), response_token_ids=extras.get("response_token_ids"),
            logprobs=extras.get("logprobs"), logprobs_temperature=extras.get("logprobs_temperature"),
            top_logprobs=extras.get("top_logprobs"),
            finish_reason=_text_column(extras.get("finish_reason") or _finish_reason(response), 32),
            adapter=extras.get("adapter"),
        )


_RECORD_MANAGER = instrumentation.manager_of_class(Record)
_RECORD_MAPPER = Record.__mapper__


def _new_record(**fields: Any) -> Record:
    """A ``Record`` built for the writer, at about a fifth of the constructor's cost.

    ``Record(**fields)`` routes every column through SQLModel's and SQLAlchemy's per-attribute
    instrumentation: ~0.1 ms of event-loop CPU per request, the largest single item of Reef's
    own code in a profile at concurrency 32. A table model does not validate in its
    constructor anyway, so ``model_construct`` (same defaults, same fields set) plus the ORM
    state SQLAlchemy would attach gives an equal instance: it inserts, compares and dumps the
    same, and later attribute sets (the writer's ``content_hash``) are tracked as usual.
    The constructor is also what configures the ORM's mappers on first use; without it the
    attributes cannot be read in a process that has not queried yet, so that is done here
    (once: the mapper's flag is checked first).
    """
    if not _RECORD_MAPPER.configured:
        configure_mappers()
    record = Record.model_construct(**fields)
    _RECORD_MANAGER._new_state_if_none(record)
    return record


def _text_column(value: Any, limit: int = 200) -> str | None:
    """A client- or upstream-chosen string as a text column can hold it: no NUL (PostgreSQL's
    text refuses it, which would lose the whole record), at most ``limit`` characters."""
    if not isinstance(value, str):
        return None
    return value.replace("\x00", "")[:limit] or None


def _finish_reason(response: Any) -> str | None:
    """Why the answer ended, from a response body of either dialect (OpenAI ``finish_reason``,
    Anthropic ``stop_reason``), when the runtime did not report it in ``call.extras``."""
    if not isinstance(response, dict):
        return None
    if response.get("object") == "response":  # the Responses API: from the status and the output
        output = response.get("output")
        if isinstance(output, list) and any(isinstance(i, dict) and i.get("type") == "function_call"
                                            for i in output):
            return "tool_calls"
        incomplete = response.get("incomplete_details")
        return "length" if isinstance(incomplete, dict) and incomplete.get("reason") == "max_output_tokens" else \
            ("stop" if response.get("status") == "completed" else None)
    reason = response.get("stop_reason")
    if reason is None:
        choices = response.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
    return reason[:32] if isinstance(reason, str) else None


def make_call(state: ServeState, ex: Exchange) -> InferenceCall:
    """The runtime's view of the request: the prepared body in the runtime's dialect."""
    body = translate_request(ex.body, ex.dialect, state.runtime_dialect,
                             default_max_tokens=state.default_max_tokens)
    if ex.stream and state.runtime_dialect == "openai":
        opts = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
        if not opts.get("include_usage"):
            # Ask for usage so the record has it; the chunk is dropped unless the client asked.
            body = {**body, "stream_options": {**opts, "include_usage": True}}
    return InferenceCall(scenario=ex.scenario, record_id=ex.record_id, body=body,
                         dialect=state.runtime_dialect, release=ex.release or base_release(ex.scenario),
                         top_logprobs=state.reef.top_logprobs(ex.scenario))


def _client_wants_usage(body: dict[str, Any]) -> bool:
    opts = body.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


async def _fail(state: ServeState, ex: Exchange, call: InferenceCall | None, exc: Exception) -> Response:
    """Record a failed call as an error and answer in the client's shape."""
    if isinstance(exc, RuntimeCallError):
        status, message = exc.status, str(exc)
    else:
        log.exception("runtime %s failed", state.runtime_name)
        status, message = 502, f"the runtime failed: {type(exc).__name__}: {exc}"
    state.metrics.upstream_errors.labels(str(status)).inc()
    record = ex.record(call, state.runtime_name, status="error", error=message)
    recorded = True
    try:
        await state.writer.write(record)
    except Exception as wexc:  # the error answer still goes out, without a receipt; the log says the record is lost
        log.error("could not store error record %s: %s", ex.record_id, wexc)
        recorded = False
    state.metrics.requests.labels(ex.route, ex.scenario, "error").inc()
    headers = ex.headers(recorded=recorded)
    if isinstance(exc, RuntimeCallError):
        return upstream_error_response(ex.dialect, state.runtime_dialect, exc, headers=headers)
    return error_response(ex.dialect, status, message, headers=headers)


class _ClientGone(Exception):
    """The client of a non-streamed request disconnected before its answer was ready."""


async def _unless_client_leaves(answer: Awaitable[Any], receive: Any) -> Any:
    """``await answer``, cancelled when the client disconnects first (``_ClientGone``): a runtime
    generating for a client that left (a local model decoding hundreds of tokens, an upstream
    billing them) stops, as it does for a stream. ``receive``: the ASGI receive of a request
    whose body was read (None: no watching). As ``_RecordedStream`` does, one plain task waits
    for the disconnect and cancels the request's own task: no second task for the answer."""
    if receive is None:
        return await answer
    me = asyncio.current_task()
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        me.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await answer
    except asyncio.CancelledError:
        if not gone:  # a shutdown's cut: the caller answers it
            raise
        _uncancel()  # the watcher's own cancellation, taken back
        raise _ClientGone from None
    finally:
        watcher.cancel()


async def complete(state: ServeState, ex: Exchange, receive: Any = None) -> Response:
    """Answer a non-streamed request; returns once the record is durable. With ``receive`` (the
    request's ASGI receive), a client that disconnects first cancels the answer: its record is
    ``incomplete``, as a stream's whose client left."""
    call = make_call(state, ex)  # a body that cannot be translated is the client's 400
    state.inflight += 1
    submitted = False
    try:
        try:
            answer = await _unless_client_leaves(state.reef.runtime.complete(call), receive)
            _check_answer_depth(answer, state.max_json_depth)
            body = translate_response(answer, state.runtime_dialect, ex.dialect, request=ex.body,
                                      response_id=ex.record_id)
        except _ClientGone:
            submitted = True
            _submit_quietly(state, ex.record(call, state.runtime_name, status="incomplete",
                                             error="the client disconnected before the answer was finished"))
            # nobody reads it: the status of nginx's "client closed request"
            return error_response(ex.dialect, 499, "the client disconnected", headers=ex.headers())
        except Exception as exc:
            submitted = True
            return await _fail(state, ex, call, exc)
        # a Responses client gets a Responses upstream's answer as it is, a failed one too (as a
        # stream's response.failed event): the record says it failed
        failed = _failure_message(body) if ex.dialect == "responses" and body.get("status") == "failed" else None
        record = ex.record(call, state.runtime_name, status="error" if failed else "ok", response=body, error=failed)
        submitted = True
        try:
            await state.writer.write(record)
        except Exception as exc:
            log.error("could not store record %s: %s", ex.record_id, exc)
            state.metrics.record_failures.inc()
            return error_response(ex.dialect, 503, "the answer could not be recorded durably, so it is "
                                                    "withheld; retry the request", headers=ex.headers(recorded=False))
        state.metrics.requests.labels(ex.route, ex.scenario, "error" if failed else "ok").inc()
        state.metrics.latency.labels(ex.route, "false").observe(time.perf_counter() - ex.started)
        return Response(jsonfast.dumps(body), media_type="application/json", headers=ex.headers())
    except asyncio.CancelledError:  # cut at shutdown: the attempt is recorded, the client told
        if submitted:
            raise
        _submit_quietly(state, ex.record(call, state.runtime_name, status="incomplete", error=cut_message(state)))
        return _cut_response(ex)
    except BaseException:
        if not submitted:
            _submit_quietly(state, ex.record(call, state.runtime_name, status="incomplete",
                                             error="cancelled before the runtime answered"))
        raise
    finally:
        state.inflight -= 1


def cut_message(state: ServeState) -> str:
    """Why an answer still running when the server stopped has no end (its record's error)."""
    return (f"cut: the server shut down before the answer was finished "
            f"(server.shutdown_timeout_s={state.reef.settings.server.shutdown_timeout_s:g})")


def _uncancel() -> None:
    """Take back the shutdown's cancellation of this task, so that the cut answer still goes out
    (the server cancels each request once, after ``server.shutdown_timeout_s``)."""
    task = asyncio.current_task()
    uncancel = getattr(task, "uncancel", None)  # Python 3.11+
    if uncancel is not None:
        uncancel()


def _cut_response(ex: Exchange) -> Response:
    _uncancel()
    return error_response(ex.dialect, 503, "the server shut down before the answer was finished; "
                                           "retry the request", headers=ex.headers())


def _check_answer_depth(answer: Any, limit: int) -> None:
    """An answer nested deeper than ``server.max_json_depth`` is the upstream's error: it could
    be neither stored readably nor re-encoded for the client."""
    if jsonfast.nesting_depth(answer, limit) > limit:
        raise RuntimeCallError(f"the runtime answered with JSON nested more than {limit} levels deep "
                               f"(server.max_json_depth)", status=502)


def _submit_quietly(state: ServeState, record: Record) -> None:
    try:
        state.writer.submit(record)
        state.metrics.requests.labels(record.route or "", record.scenario, record.status).inc()
    except Exception as exc:
        log.error("could not queue %s record %s: %s", record.status, record.id, exc)


def _sse(dialect: str, event: dict[str, Any]) -> bytes:
    """One server-sent event: Chat Completions sends bare ``data:`` lines; Anthropic and the
    Responses API name each event after its ``type``."""
    if dialect == "openai":
        return b"data: " + jsonfast.dumps(event) + b"\n\n"
    return b"event: " + str(event.get("type", "message")).encode() + b"\ndata: " + jsonfast.dumps(event) + b"\n\n"


def _stream_error(dialect: str, status: int, message: str) -> dict[str, Any]:
    """An in-band error event: the Responses ``error`` event carries ``code``/``message`` and,
    like the other dialects' error events, an ``error`` object the SDKs raise on."""
    body = error_body(dialect, status, message, error_type="api_error")
    if dialect == "responses":
        return {"type": "error", "code": "api_error", "message": message, "param": None, **body}
    return body


def _failed_response(final: dict[str, Any] | None) -> str | None:
    """Why a Responses upstream's stream ended with ``response.failed`` (the record's error; the
    event itself goes to the client as sent), or None."""
    if final is None or final.get("type") != "response.failed":
        return None
    return _failure_message(final.get("response"))


def _failure_message(response: Any) -> str:
    """The record's error for a Responses ``response`` that ``failed``."""
    error = response.get("error") if isinstance(response, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return f"the upstream response failed: {message or 'no reason given'}"


def _open_stream(state: ServeState, call: InferenceCall) -> AsyncIterator[list[dict[str, Any]]]:
    """The runtime's stream as batches of events (``Runtime.stream_batches``: the runtime's own
    batches, one socket write per network read upstream, or by default one event each)."""
    return state.reef.runtime.stream_batches(call).__aiter__()


class _StreamJob:
    """The bookkeeping of one streamed answer, finalized exactly once however it ends:
    finished, broken upstream, client gone, cancelled at shutdown, or never started (a
    client that leaves before the first byte: the body generator then never runs)."""

    def __init__(self, state: ServeState, ex: Exchange, call: InferenceCall,
                 batches: AsyncIterator[list[dict[str, Any]]]):
        self.state = state
        self.ex = ex
        self.call = call
        self.batches = batches
        self.assembler = stream_assembler(ex.dialect)
        self.recorded = False
        self.closed = False
        #: set when the server sees the client's disconnect (sends to a gone client are no-ops,
        #: so without this a stream already buffered upstream would be recorded as delivered)
        self.client_gone = False
        self.error = "the client disconnected before the stream finished"

    def record(self, status: str, error: str | None = None) -> Record:
        self.recorded = True
        try:
            response = self.assembler.result()
        except Exception as exc:  # events of shapes no answer has (a hostile upstream): still a record
            log.warning("could not assemble the answer of %s: %s: %s", self.ex.record_id, type(exc).__name__, exc)
            response = None
            status = "error" if status == "ok" else status
            error = (f"{error}; " if error else "") + (f"the streamed events do not assemble into an answer "
                                                       f"({type(exc).__name__}: {exc})")
        return self.ex.record(self.call, self.state.runtime_name, status=status, response=response, error=error)

    async def finalize(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if not self.recorded:
                _submit_quietly(self.state, self.record("incomplete", self.error))
            aclose = getattr(self.batches, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:
                    log.debug("closing the runtime stream failed", exc_info=True)
        finally:
            self.state.inflight -= 1
            self.state.streaming.pop(self.ex.record_id, None)


class _RecordedStream(StreamingResponse):
    """A StreamingResponse that finalizes its job when the response ends, whatever the cause.

    Starlette watches for the client's disconnect with an anyio task group per response (two
    tasks, cancel scopes and events: ~15 % of the event loop's time on a streamed request).
    Here the stream is sent from the request's own task and one plain asyncio task waits for
    the disconnect; when it comes first it marks the job and cancels the sending, which is what
    Starlette's task group does.
    """

    def __init__(self, job: _StreamJob, content: AsyncIterator[bytes], **kwargs: Any):
        super().__init__(content, **kwargs)
        self.job = job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        job = self.job
        sending = asyncio.current_task()
        finished = False
        interrupted = False

        async def watch() -> None:
            nonlocal interrupted
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not finished:
                        job.client_gone = interrupted = True
                        sending.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            _uncancel()
            if not interrupted:  # cut at shutdown: the record says so, the client gets an error event
                job.error = cut_message(job.state)
                finished = True
                watcher.cancel()
                await self._send_cut(send)
        finally:
            finished = True  # before any await: the watcher cannot run in between
            watcher.cancel()
            with anyio.CancelScope(shield=True):
                await job.finalize()

    async def _send_cut(self, send: Any) -> None:
        """End a stream cut at shutdown: an in-band error event (both SDKs raise on it), then the
        end of the body. A client too slow to take it within a second is left to the closing
        connection."""
        dialect = self.job.ex.dialect
        event = _sse(dialect, _stream_error(dialect, 503, "the server shut down before the answer was finished; "
                                                          "retry the request"))
        try:
            with anyio.fail_after(1.0):
                await send({"type": "http.response.body", "body": event, "more_body": False})
        except Exception:
            log.debug("could not tell a cut stream's client", exc_info=True)


async def stream(state: ServeState, ex: Exchange) -> Response:
    """Answer a streamed request. Upstream errors before the first event are plain error answers."""
    call = make_call(state, ex)
    state.inflight += 1
    state.streaming[ex.record_id] = ex.scenario
    try:
        batches = _open_stream(state, call)
        try:
            first: list[dict[str, Any]] = await batches.__anext__()
        except StopAsyncIteration:
            first = []
    except BaseException as exc:
        state.inflight -= 1
        state.streaming.pop(ex.record_id, None)
        if isinstance(exc, Exception):
            return await _fail(state, ex, call, exc)
        cut = isinstance(exc, asyncio.CancelledError)
        _submit_quietly(state, ex.record(call, state.runtime_name, status="incomplete",
                                         error=cut_message(state) if cut else "cancelled before the runtime answered"))
        if cut:
            return _cut_response(ex)
        raise
    state.metrics.first_byte.labels(ex.route).observe(time.perf_counter() - ex.started)
    job = _StreamJob(state, ex, call, batches)
    translator = stream_translator(state.runtime_dialect, ex.dialect, request=ex.body, response_id=ex.record_id)
    return _RecordedStream(job, _relay(job, first, translator),
                           media_type="text/event-stream", headers={**ex.headers(), **_SSE_HEADERS})


async def _relay(job: _StreamJob, first: list[dict[str, Any]], translator: Any) -> AsyncIterator[bytes]:
    state, ex, assembler = job.state, job.ex, job.assembler
    dialect = ex.dialect
    # OpenAI: Reef asks the runtime for usage (for the record); the client sees it only if it asked.
    drop_usage = dialect == "openai" and not _client_wants_usage(ex.body)
    # the terminal event (Anthropic message_stop, Responses response.completed), sent after the
    # record is durable, with the receipt
    held_stop: dict[str, Any] | None = None
    try:
        batch: list[dict[str, Any]] | None = first
        while True:
            if job.client_gone:
                return  # finalize() records it incomplete
            if batch is None:
                pending = translator.finish()
            else:
                pending = [out for ev in batch for out in translator.feed(ev)]
            chunk = b""
            for ev in pending:
                if dialect == "anthropic" and ev.get("type") == "message_stop":
                    held_stop = ev
                    continue
                assembler.add(ev)
                if dialect == "responses" and ev.get("type") in TERMINAL_EVENTS:
                    held_stop = ev
                    continue
                if drop_usage and is_usage_chunk(ev):
                    continue
                chunk += _sse(dialect, ev)
            if chunk:
                yield chunk
            if batch is None:
                break
            try:
                batch = await job.batches.__anext__()
            except StopAsyncIteration:
                batch = None
    except Exception as exc:  # upstream broke mid-stream: record incomplete, tell the client
        error = str(exc) if isinstance(exc, RuntimeCallError) else f"{type(exc).__name__}: {exc}"
        status = exc.status if isinstance(exc, RuntimeCallError) else 502
        state.metrics.upstream_errors.labels(str(status)).inc()
        _submit_quietly(state, job.record("incomplete", error))
        # Tell the client in-band: both SDKs raise on an error event inside a stream.
        yield _sse(dialect, _stream_error(dialect, status, error))
        return
    # One turn of the loop before the answer counts as delivered: a stream that was already
    # buffered upstream can be relayed without ever yielding, and the disconnect watcher must get
    # to look (a client that left while the runtime was still silent is seen here).
    await asyncio.sleep(0)
    if job.client_gone:
        return
    failed = _failed_response(held_stop) if dialect == "responses" else None
    try:
        await state.writer.write(job.record("error" if failed else "ok", failed))
    except Exception as exc:  # no durable record, so no receipt marker: the client is told
        log.error("could not store record %s: %s", ex.record_id, exc)
        state.metrics.record_failures.inc()
        yield _sse(dialect, _stream_error(dialect, 503, "the answer could not be recorded durably; "
                                                        "retry the request"))
        return
    marker = {"agent_record_id": ex.record_id, "release_id": ex.release_id}
    if dialect == "openai":
        base = assembler.base
        yield _sse(dialect, {"id": base.get("id", ""), "object": "chat.completion.chunk",
                             "created": base.get("created", int(time.time())), "model": base.get("model", ""),
                             "choices": [], "reef": marker}) + b"data: [DONE]\n\n"
    elif dialect == "responses":
        final = dict(held_stop or {"type": "response.completed", "response": assembler.result()})
        final["reef"] = marker
        yield _sse(dialect, final)
    else:
        stop = dict(held_stop or {"type": "message_stop"})
        stop["reef"] = marker
        yield _sse(dialect, stop)
    state.metrics.requests.labels(ex.route, ex.scenario, "error" if failed else "ok").inc()
    state.metrics.latency.labels(ex.route, "true").observe(time.perf_counter() - ex.started)
