"""The FastAPI application factory."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from ..kernel import Reef
from ..served_config import announce
from .browser_guard import BrowserGuard
from .errors import install_error_handlers
from .fastpath import InferenceFastPath
from .hosts import AllowedHosts
from .limits import BodyLimitMiddleware
from .metrics import Metrics
from .state import ServeState

log = logging.getLogger("reef.serve")

#: the OpenTelemetry providers that stand in until an SDK is configured (what
#: ``get_tracer_provider()`` and its siblings return in a process nobody instrumented)
_PLACEHOLDER_PROVIDERS = frozenset({"ProxyTracerProvider", "_ProxyMeterProvider", "ProxyLoggerProvider",
                                    "NoOpTracerProvider", "NoOpMeterProvider", "NoOpLoggerProvider"})


def telemetry_options() -> dict:
    """FastAPI's ``telemetry`` argument: its native OpenTelemetry support as configured when
    the app is built.

    FastAPI (0.16x) asks on every request whether a tracer, meter or logger provider has been
    configured: reading the environment and the global providers, about 5 % of the event
    loop's time on the proxy path. The answer is taken once here instead: when this process
    has a provider (``opentelemetry-instrument reef serve``, or an SDK set up before the
    server starts), FastAPI keeps emitting its spans, metrics and logs; otherwise they are off.
    Older FastAPI versions have no such argument (an empty dict).
    """
    import inspect

    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    try:
        from opentelemetry import _logs, metrics, trace
    except ImportError:
        return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    configured = [type(get()).__name__ not in _PLACEHOLDER_PROVIDERS
                  for get in (trace.get_tracer_provider, metrics.get_meter_provider, _logs.get_logger_provider)]
    if any(configured):
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


class ReefApp(FastAPI):
    """FastAPI whose inference routes may be taken before its own middleware stack.

    With ``entry`` set (``BodyLimitMiddleware`` around ``InferenceFastPath`` around the whole
    FastAPI app), a request for an inference route skips the layers FastAPI and Starlette wrap
    every request in (server-error, exception-telemetry and body-limit middleware, each a
    coroutine and a ``send`` wrapper: about 7 % of the event loop's CPU per request on the
    proxy path); everything else goes through them as before. ``entry`` stays None, and the
    fast path sits inside FastAPI's stack, while OpenTelemetry is on, so that inference
    requests keep their spans, and once other middleware is added to the app (it has to see
    every request too).

    ``guard`` (``browser_guard.BrowserGuard``) checks every HTTP request before either: its
    ``Host`` and, for state-changing methods, whether a page of another site sent it.
    """

    entry: ASGIApp | None = None
    guard: BrowserGuard | None = None
    _max_body_bytes: int = 0

    def serve_inference(self, max_body_bytes: int, *, in_front: bool) -> None:
        """Install the inference fast path inside the body-size guard: in front of FastAPI's
        stack (``entry``) or as the innermost user middleware."""
        self._max_body_bytes = max_body_bytes
        if in_front:
            self.entry = BodyLimitMiddleware(InferenceFastPath(self.stack), max_body_bytes=max_body_bytes)
        else:
            super().add_middleware(InferenceFastPath)
            super().add_middleware(BodyLimitMiddleware, max_body_bytes=max_body_bytes)

    def add_middleware(self, middleware_class: Any, *args: Any, **kwargs: Any) -> None:
        if self.entry is not None:  # the fast path moves inside, under the new middleware
            self.entry = None
            self.serve_inference(self._max_body_bytes, in_front=False)
        super().add_middleware(middleware_class, *args, **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.guard is not None and scope["type"] == "http":
            refused = self.guard.refusal(scope)
            if refused is not None:
                await self.guard.refuse(scope, send, *refused)
                return
        if self.entry is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        await self.entry(scope, receive, send)

    async def stack(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app as FastAPI serves it (its middleware, then the router)."""
        await super().__call__(scope, receive, send)


def create_app(reef: Reef) -> FastAPI:
    """Build the app serving ``reef``; the kernel and the record writer start and stop with it.

    Each app has its own metrics registry, so one process may build many apps (tests).
    """
    state = ServeState.build(reef, Metrics())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if not reef.started:  # `reef serve` starts it before uvicorn, to report a failure in one line
            await reef.start()
        state.writer.start()
        state.started = True
        # where the CLI finds this server and what it serves with (``runner`` sets listen_url)
        served = announce(reef.settings, url=getattr(app.state, "listen_url", None))
        try:
            yield
        finally:
            if served is not None:
                served.stopped()
            state.started = False
            # uvicorn has let requests finish (or cancelled them after its grace period); give
            # cancelled ones a moment to queue their records, flush the writer off the loop,
            # then stop the kernel.
            await state.drain()
            await anyio.to_thread.run_sync(state.writer.close)
            await reef.stop()

    # The schema and the docs page are served by routes_ops behind auth (any valid token).
    telemetry = telemetry_options()
    app = ReefApp(title="Reef", version="0.1.0", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None,
                  description="OpenAI- and Anthropic-compatible inference that records every request "
                              "as attributable experience and learns from feedback quoting receipts.",
                  **telemetry)
    app.state.reef = reef
    app.state.serve = state
    install_error_handlers(app)
    # the Host allow-list (DNS rebinding) and the refusal of cross-site state changes
    server = reef.settings.server
    app.guard = BrowserGuard(AllowedHosts.for_server(server.host, server.allowed_hosts),
                             on_refusal=lambda status: state.metrics.http_errors.labels(str(status)).inc())
    # The inference fast path runs inside the body-size guard: in front of FastAPI's stack
    # unless FastAPI's OpenTelemetry is on (an empty ``telemetry``), then inside it.
    app.serve_inference(reef.settings.server.max_body_bytes, in_front=bool(telemetry))

    from ..ui import install_ui
    from .routes_inference import router as inference_router
    from .routes_learning import router as learning_router
    from .routes_ops import router as ops_router
    from .routes_reef import router as reef_router

    app.include_router(ops_router)
    app.include_router(inference_router)
    app.include_router(reef_router)
    app.include_router(learning_router)
    install_ui(app)  # the dashboard at /ui: server-rendered pages over these routes
    return app
