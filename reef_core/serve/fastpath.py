"""Dispatch of the two inference routes without FastAPI's router, dependencies and stacks.

The inference routes are the hot path: at concurrency 1 FastAPI's routing, dependency
resolution and exception/exit-stack middleware cost about 0.17 ms of a request's ~1.4 ms
overhead. This pure-ASGI middleware answers ``POST /v1/chat/completions`` and
``POST /v1/messages`` (and ``POST /v1/responses``) by calling the same handler the routes use (``_serve``) after the same
authentication, and turns exceptions into responses with the app's own exception handlers,
so answers, error shapes and metrics are identical. The FastAPI routes stay declared: they
describe the endpoints in ``/openapi.json`` and serve anything this does not take.

Where it sits: in front of FastAPI's own middleware (``app.ReefApp.entry``), unless FastAPI's
OpenTelemetry support is on, which has to see every request; then inside it.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from .auth import authenticate, check_role

ROUTES = {
    "/v1/chat/completions": ("openai", "openai.chat"),
    "/v1/messages": ("anthropic", "anthropic.messages"),
    "/v1/responses": ("responses", "openai.responses"),
}


class InferenceFastPath:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = ROUTES.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if target is None:
            await self.app(scope, receive, send)
            return
        from .routes_inference import _serve

        request = Request(scope, receive)
        try:
            principal = authenticate(request)
            check_role(principal, ("infer",))
            response = await _serve(request, principal, *target)
        except Exception as exc:  # answered by the app's handler for it, as the router would
            response = await _handler_for(scope["app"], exc)(request, exc)
        await response(scope, receive, send)


def _handler_for(app: Any, exc: Exception):
    """The most specific handler the app registered for ``exc`` (``Exception`` catches all)."""
    handlers = app.exception_handlers
    return next(handlers[cls] for cls in type(exc).__mro__ if cls in handlers)
