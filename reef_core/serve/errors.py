"""Error bodies in the shape each client expects, and the app's exception handlers.

Provider routes answer errors the way the provider would, so SDKs raise their usual
exception types: OpenAI ``{"error": {"message", "type", "param", "code"}}``, Anthropic
``{"type": "error", "error": {"type", "message"}}``. Every other route answers
``{"error": {"type", "message"}}``. No handler ever includes a stack trace.
"""

from __future__ import annotations

import errno
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from ..commit.release_checks import ReleaseRefused
from ..errors import (
    ConfigError,
    ConflictError,
    ModelNotFound,
    NotFoundError,
    ReefError,
    RuntimeCallError,
    describe_error,
)
from . import jsonfast

log = logging.getLogger("reef.serve")

OPENAI_PATHS = ("/v1/chat/completions", "/v1/responses")
ANTHROPIC_PATHS = ("/v1/messages",)

_OPENAI_TYPES = {
    400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
    413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 409: "invalid_request_error",
    413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error",
    529: "overloaded_error",
}
_REEF_TYPES = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 409: "conflict", 413: "payload_too_large", 422: "invalid",
    500: "internal_error", 502: "upstream_error", 503: "unavailable", 504: "upstream_timeout",
}
_OPENAI_CODES = {401: "invalid_api_key", 404: "not_found", 413: "payload_too_large"}


class BodyTooLarge(Exception):
    """The request body is larger than ``server.max_body_bytes``."""

    def __init__(self, limit: int):
        super().__init__(f"request body is larger than the server's limit of {limit} bytes "
                         f"(server.max_body_bytes)")
        self.limit = limit


class ClientError(Exception):
    """A mistake in the client's request, answered with ``status`` in the route's error shape."""

    def __init__(self, message: str, status: int = 400, *, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param


def dialect_of(request_or_path: Request | str) -> str:
    """Which error shape a path answers with: ``openai``, ``anthropic`` or ``reef``."""
    if isinstance(request_or_path, str):
        path, headers = request_or_path, {}
    else:
        path, headers = request_or_path.url.path, request_or_path.headers
    if path.startswith(ANTHROPIC_PATHS):
        return "anthropic"
    if path.startswith(OPENAI_PATHS):
        return "openai"
    if path.startswith("/v1/"):
        return "anthropic" if "anthropic-version" in headers else "openai"
    return "reef"


def error_body(dialect: str, status: int, message: str, *, param: str | None = None,
               error_type: str | None = None) -> dict[str, Any]:
    """A provider- or Reef-shaped error body (the Responses API answers errors as OpenAI does)."""
    if dialect in ("openai", "responses"):
        t = error_type or _OPENAI_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"error": {"message": message, "type": t, "param": param, "code": _OPENAI_CODES.get(status)}}
    if dialect == "anthropic":
        t = error_type or _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": t, "message": message}}
    t = error_type or _REEF_TYPES.get(status, "error")
    body: dict[str, Any] = {"type": t, "message": message}
    if param:
        body["param"] = param
    return {"error": body}


def error_response(dialect: str, status: int, message: str, *, param: str | None = None,
                   headers: dict[str, str] | None = None, error_type: str | None = None) -> Response:
    return Response(jsonfast.dumps(error_body(dialect, status, message, param=param, error_type=error_type)),
                    status_code=status, media_type="application/json", headers=headers)


def _same_error_shape(dialect: str, runtime_dialect: str) -> bool:
    """Whether an error body of ``runtime_dialect`` reads right to a ``dialect`` client as it is:
    the same dialect, or Chat Completions and Responses, which answer errors alike (so a code
    such as ``context_length_exceeded``, which agents act on, reaches a Responses client)."""
    return dialect == runtime_dialect or {dialect, runtime_dialect} <= {"openai", "responses"}


def upstream_error_response(dialect: str, runtime_dialect: str, exc: RuntimeCallError,
                            headers: dict[str, str] | None = None) -> Response:
    """Relay a runtime error: the upstream body as is when it already speaks the client's
    dialect, otherwise the upstream message re-shaped; the upstream status either way."""
    status = exc.status if 400 <= exc.status <= 599 else 502
    if exc.headers:  # when to retry, as the upstream said (Reef's own headers win)
        headers = {**exc.headers, **(headers or {})}
    body = exc.body
    if _same_error_shape(dialect, runtime_dialect) and isinstance(body, dict) and isinstance(body.get("error"), dict):
        if dialect == "responses" and runtime_dialect == "openai":
            body = _responses_param(body)
        return Response(jsonfast.dumps(body), status_code=status, media_type="application/json",
                        headers=headers)
    return error_response(dialect, status, str(exc), headers=headers)


#: Chat Completions fields an error names, as the Responses request a client sent names them
_RESPONSES_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
                     "response_format": "text.format"}


def _responses_param(body: dict) -> dict:
    """A chat runtime's error for a Responses client, its ``param`` named as the client's request
    names it (``messages[0].content`` → ``input``): the client never sent ``messages``."""
    param = body["error"].get("param")
    if not isinstance(param, str):
        return body
    head = param.split("[", 1)[0].split(".", 1)[0]
    if head not in _RESPONSES_PARAMS:
        return body
    return {**body, "error": {**body["error"], "param": _RESPONSES_PARAMS[head]}}


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it wraps) says the disk or quota is full: ``ENOSPC`` from
    the OS, or the database's own wording of it (SQLite, PostgreSQL)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(getattr(current, "orig", None) or "") + " " + (current.args[0] if current.args and
                                                                  isinstance(current.args[0], str) else "")
        if "disk is full" in text or "No space left on device" in text or "could not extend file" in text:
            return True
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return False


#: SQLAlchemy's errors for a database that cannot be reached or went away (``store_unavailable``)
STORE_DOWN = ("OperationalError", "InterfaceError", "DisconnectionError")


def store_unavailable(exc: BaseException) -> str | None:
    """One line saying why the record store could not be reached, when ``exc`` is a database that
    went away or cannot be connected to (PostgreSQL restarting or unreachable, a SQLite file
    locked past its busy timeout); None for any other error."""
    from sqlalchemy import exc as sa_exc

    if not isinstance(exc, tuple(getattr(sa_exc, kind) for kind in STORE_DOWN)) or disk_full(exc):
        return None
    return describe_error(exc)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    err = errors[0]
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
    where = ".".join(loc)
    msg = err.get("msg", "invalid value")
    return (f"{where}: {msg}" if where else msg), (where or None)


def _count(request: Request, status: int) -> None:
    serve = getattr(request.app.state, "serve", None)
    if serve is not None:
        serve.metrics.http_errors.labels(str(status)).inc()


def install_error_handlers(app: FastAPI) -> None:
    """Map every error to a JSON body in the route's shape; never leak a stack trace.

    Every error answer produced here is counted in ``reef_http_errors_total{status}``.
    """

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        _count(request, exc.status_code)
        return error_response(dialect_of(request), exc.status_code, message, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        if any(e.get("type") == "json_invalid" for e in exc.errors()):
            _count(request, 400)
            return error_response(dialect_of(request), 400, "the request body is not valid JSON")
        message, param = _validation_message(exc)
        status = 422
        _count(request, status)
        return error_response(dialect_of(request), status, message, param=param)

    @app.exception_handler(ClientError)
    async def client_error(request: Request, exc: ClientError) -> Response:
        _count(request, exc.status)
        return error_response(dialect_of(request), exc.status, str(exc), param=exc.param)

    @app.exception_handler(BodyTooLarge)
    async def too_large(request: Request, exc: BodyTooLarge) -> Response:
        _count(request, 413)
        return error_response(dialect_of(request), 413, str(exc))

    @app.exception_handler(ModelNotFound)
    async def model_not_found(request: Request, exc: ModelNotFound) -> Response:
        _count(request, 404)
        dialect = dialect_of(request)
        if dialect == "openai":  # what OpenAI itself answers for a model it does not serve
            body = {"error": {"message": str(exc), "type": "invalid_request_error", "param": "model",
                              "code": "model_not_found"}}
            return Response(jsonfast.dumps(body), status_code=404, media_type="application/json")
        return error_response(dialect, 404, str(exc), param="model")

    @app.exception_handler(ReefError)
    async def reef_error(request: Request, exc: ReefError) -> Response:
        if isinstance(exc, RuntimeCallError):
            status = exc.status if 400 <= exc.status <= 599 else 502
        elif isinstance(exc, NotFoundError):
            status = 404
        elif isinstance(exc, (ConflictError, ReleaseRefused)):  # ReleaseRefused: the chain holds it, unusable
            status = 409
        elif isinstance(exc, ConfigError):
            status = 400
        else:
            log.error("unhandled Reef error on %s %s: %s", request.method, request.url.path, exc)
            status = 500
        _count(request, status)
        return error_response(dialect_of(request), status, str(exc))

    @app.exception_handler(ClientDisconnect)
    async def client_left(request: Request, exc: ClientDisconnect) -> Response:
        # The client hung up (or was cut off by a body timeout) while its body was read: no one
        # is there to answer, and it is no server error.
        log.debug("client left during %s %s", request.method, request.url.path)
        return error_response(dialect_of(request), 400, "the client disconnected before sending the whole body")

    @app.exception_handler(RecursionError)
    async def too_deep(request: Request, exc: RecursionError) -> Response:
        # Only a request nested too deeply for a parser reaches this (bodies of the provider
        # and report routes are depth-checked before use); never a 500 for the client's input.
        _count(request, 400)
        return error_response(dialect_of(request), 400, "the request nests objects and arrays too deeply "
                                                        "(server.max_json_depth)")

    async def store_down(request: Request, exc: Exception) -> Response:
        # a database that went away: retryable, and the same for every request while it lasts,
        # so one line each (handled here, not by the catch-all, which logs a traceback)
        down = store_unavailable(exc)
        if down is None:
            return await internal_error(request, exc)
        log.error("%s %s failed: the record store is unavailable (%s)", request.method, request.url.path, down)
        _count(request, 503)
        return error_response(dialect_of(request), 503, "the record store is unavailable; retry shortly (the "
                                                        "server log says why)")

    from sqlalchemy import exc as sa_exc

    for kind in STORE_DOWN:
        app.add_exception_handler(getattr(sa_exc, kind), store_down)

    async def os_error(request: Request, exc: Exception) -> Response:
        # a full disk is one line (``internal_error``); registered for its class so Starlette does not
        # hand it on to the server's own log as well, as it does whatever the catch-all handler answered
        return await internal_error(request, exc)

    app.add_exception_handler(OSError, os_error)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        if disk_full(exc):
            log.error("%s %s failed: the disk is full", request.method, request.url.path)
            _count(request, 507)
            return error_response(dialect_of(request), 507, "the server's disk is full; free space and retry",
                                  error_type="insufficient_storage")
        log.exception("internal error on %s %s", request.method, request.url.path)
        _count(request, 500)
        return error_response(dialect_of(request), 500,
                              "internal server error; the server log has the details")
