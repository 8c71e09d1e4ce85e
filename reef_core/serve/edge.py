"""Bounds on what one HTTP connection may cost, enforced below the app (uvicorn's httptools protocol).

Uvicorn on its own never times out a connection that is still sending its request: a client
that trickles headers or a body one byte at a time holds a socket (and a file descriptor)
forever, and a few hundred of them exhaust ``RLIMIT_NOFILE`` so that nobody else can connect,
before any token is checked. Malformed framing is answered in plain text. This module closes
those gaps with a protocol subclass, built per server by :func:`uvicorn_options`:

``server.header_timeout_s``
    The request line and headers must be complete this many seconds after the connection
    opened (first request) or after the first byte of the request (later requests on a
    keep-alive connection). Otherwise: JSON 408 and close. Idle time between requests stays
    uvicorn's ``timeout_keep_alive``.
``server.body_timeout_s``
    While a request body is being received, the longest pause between two pieces of it.
    Otherwise the request is dropped: JSON 408 when no response started yet, then close. Time
    during which the server is not reading (the app has not drained what arrived, a pipelined
    request waits its turn, an ``Expect: 100-continue`` client waits for its go-ahead) is the
    server's, not the client's, and does not count.
``server.max_connections``
    Open connections at most; one accepted past it gets a tiny JSON 503 and is closed at once,
    so refused clients do not hold descriptors. Established connections are not affected.
    ``null`` derives the number from the file-descriptor limit (:func:`derived_max_connections`).
``server.max_header_bytes``
    Request line plus headers; larger is a JSON 431 and close. Checked while the headers
    arrive (so a never-ending header costs at most this much memory plus one read) and exactly
    once they are complete, before the app sees the request.

Malformed framing (httptools parse errors: bad request line, invalid header bytes, bad chunked
encoding) is a JSON 400 ``malformed HTTP request: ...`` with ``connection: close``. Every body
here is Reef's ``{"error": {"type", "message"}}``. A connection already streaming a response
cannot carry an error answer, so there the connection is only closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ..config import ServerSettings, Settings
from . import jsonfast
from .errors import dialect_of, error_body

log = logging.getLogger("reef.serve")

#: descriptors kept free of client connections for the database, log and state files, and the
#: listening socket
FD_RESERVE = 64
#: bounds on the connection cap derived from the descriptor limit
MIN_CONNECTIONS = 16
MAX_CONNECTIONS = 4096
#: seconds between two warnings that the connection cap refuses clients
_CAP_WARNING_INTERVAL_S = 60.0

# where the parser stands in the current request
_IDLE, _HEADERS, _BODY = 0, 1, 2


def derived_max_connections(soft_limit: int | None = None) -> int:
    """The connection cap for ``server.max_connections: null``, from ``RLIMIT_NOFILE``'s soft limit.

    ``FD_RESERVE`` descriptors stay free for the database and files; the rest is split in half
    because a client connection whose request is proxied holds one upstream socket as well.
    At least ``MIN_CONNECTIONS``, at most ``MAX_CONNECTIONS`` (one worker serves no more
    usefully; an unlimited descriptor limit gets that too).
    """
    if soft_limit is None:
        try:
            import resource
        except ImportError:  # pragma: no cover - no RLIMIT_NOFILE on this platform
            return MAX_CONNECTIONS // 4
        soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft_limit == resource.RLIM_INFINITY:
            return MAX_CONNECTIONS
    if soft_limit < 0:
        return MAX_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, (soft_limit - FD_RESERVE) // 2))


@dataclass(frozen=True)
class EdgeLimits:
    """The connection-level bounds one server enforces (see the module docstring)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = MAX_CONNECTIONS
    max_header_bytes: int = 32 * 1024

    @classmethod
    def from_settings(cls, server: ServerSettings) -> EdgeLimits:
        cap = server.max_connections if server.max_connections is not None else derived_max_connections()
        return cls(header_timeout_s=float(server.header_timeout_s), body_timeout_s=float(server.body_timeout_s),
                   max_connections=int(cap), max_header_bytes=int(server.max_header_bytes))


class _Refused(Exception):
    """Raised inside a parser callback after the edge answered, to stop parsing the rest of the read."""


class EdgeHttpProtocol(HttpToolsProtocol):
    """Uvicorn's httptools protocol with the bounds of :class:`EdgeLimits`.

    Use a subclass bound to limits (:func:`edge_protocol`); uvicorn instantiates the class itself
    for every accepted connection. Timers are armed only when a read ends with the headers or
    the body still incomplete, so a request that arrives in one read costs one timer per
    connection (the one armed when it opened), not one per request.
    """

    limits: EdgeLimits = EdgeLimits()
    #: per server class: when the connection cap last warned, and refusals since
    _cap_state: dict[str, float] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _IDLE
        self._refused = False
        #: loop time by which the current request's headers must be complete (None: no request started)
        self._header_deadline: float | None = None
        self._header_timer: asyncio.TimerHandle | None = None
        #: loop time of the last progress on the current request body
        self._body_progress = 0.0
        self._body_timer: asyncio.TimerHandle | None = None
        #: raw bytes of the current request's head seen so far (an upper bound, see data_received)
        self._header_bytes = 0
        #: whether every byte of the current read so far belongs to the request head being received
        self._read_is_head = False

    # -- connection life --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._warn_cap()
            self._refuse(503, "the server has too many open connections; retry shortly", "unavailable",
                         extra_headers=b"retry-after: 1\r\n")
            return
        self._header_deadline = self.loop.time() + self.limits.header_timeout_s
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Uvicorn's ``data_received`` (same parsing, upgrade handling and keep-alive reset), with
        the header and body clocks, the header-size bound and JSON answers to malformed framing."""
        if self._refused:
            return
        self._unset_keepalive_if_required()
        self._read_is_head = self._phase != _BODY
        if self._phase == _IDLE and self._header_deadline is None:
            # the first byte of the next request (or stray bytes between requests)
            self._header_deadline = self.loop.time() + self.limits.header_timeout_s
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # the parser stops after a request asking to upgrade; without a WebSocket protocol
            # that request was served as plain HTTP, and the rest of this read is dropped (as uvicorn does)
            if self._should_upgrade():
                self._cancel_timers()
                self.handle_websocket_upgrade()
                return
            self._unsupported_upgrade_warning()
        except httptools.HttpParserError as exc:
            if self._refused:  # a callback answered already (e.g. 431) and stopped the parser
                return
            cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) and exc.__context__ else exc
            self._refuse(400, f"malformed HTTP request: {cause}", "bad_request")
            return
        if self._phase == _HEADERS:
            # the read ended inside a request head: all of it was head bytes, unless an earlier
            # request ended inside the same read (then its share is unknown and not counted; the
            # exact check at on_headers_complete still applies)
            if self._read_is_head:
                self._header_bytes += len(data)
                if self._header_bytes > self.limits.max_header_bytes:
                    self._refuse_oversized_head()
                    return
        elif self._phase == _BODY:
            self._body_progress = self.loop.time()
            if self._body_timer is None:
                self._body_timer = self.loop.call_at(self._body_progress + self.limits.body_timeout_s,
                                                     self._on_body_timer)
        if self._header_deadline is not None:
            self._arm_header_timer()

    # -- parser callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _HEADERS
        self._header_bytes = 0
        if self._header_deadline is None:  # a pipelined request beginning inside the same read
            self._header_deadline = self.loop.time() + self.limits.header_timeout_s

    def on_headers_complete(self) -> None:
        self._header_deadline = None
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if self._head_size() > self.limits.max_header_bytes:
            self._refuse_oversized_head()
            raise _Refused
        self._phase = _BODY  # until on_message_complete, which follows at once when there is no body
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        self._read_is_head = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    # -- the bounds -------------------------------------------------------------------------

    def _head_size(self) -> int:
        """Request line plus headers as sent, give or take optional whitespace."""
        size = len(self.parser.get_method()) + len(self.url) + 14  # spaces, "HTTP/1.1", CRLF, final CRLF
        for name, value in self.headers:
            size += len(name) + len(value) + 4
        return size

    def _refuse_oversized_head(self) -> None:
        self._refuse(431, f"request line and headers are larger than the server's limit of "
                          f"{self.limits.max_header_bytes} bytes (server.max_header_bytes)", "headers_too_large")

    def _arm_header_timer(self) -> None:
        if self._header_timer is None and self._header_deadline is not None:
            self._header_timer = self.loop.call_at(self._header_deadline, self._on_header_timer)

    def _on_header_timer(self) -> None:
        self._header_timer = None
        if self._refused or self._header_deadline is None or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused or (self.cycle is not None and not self.cycle.response_complete):
            # the server is not reading (a response is still being produced on this connection,
            # or pipelined requests wait): the client is not the slow side, so the clock restarts
            self._header_deadline = now + self.limits.header_timeout_s
        if now < self._header_deadline:
            self._arm_header_timer()
            return
        self._refuse(408, f"the request line and headers did not arrive within {self.limits.header_timeout_s:g}s "
                          f"(server.header_timeout_s)", "request_timeout")

    def _on_body_timer(self) -> None:
        self._body_timer = None
        if self._refused or self._phase != _BODY or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused or (self.cycle is not None and self.cycle.waiting_for_100_continue):
            self._body_progress = now  # waiting on the server, not the client
        due = self._body_progress + self.limits.body_timeout_s
        if now < due:
            self._body_timer = self.loop.call_at(due, self._on_body_timer)
            return
        self._refuse(408, f"the request body paused longer than {self.limits.body_timeout_s:g}s "
                          f"(server.body_timeout_s)", "request_timeout")

    def _refuse(self, status: int, message: str, error_type: str, *, extra_headers: bytes = b"") -> None:
        """Answer ``status`` in JSON (unless a response is already on the wire), stop the request's
        app (its ``receive`` sees ``http.disconnect``, its sends are dropped) and close."""
        if self._refused:
            return
        self._refused = True
        self._cancel_timers()
        if status != 503:
            log.debug("HTTP %d to %s: %s", status, self._peer(), message)
        cycle = self.cycle
        on_the_wire = cycle is not None and cycle.response_started and not cycle.response_complete
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self.pipeline.clear()
        if not on_the_wire and not self.transport.is_closing():
            self.transport.write(self._error_bytes(status, message, error_type, extra_headers))
        self.transport.close()

    def _error_bytes(self, status: int, message: str, error_type: str, extra_headers: bytes) -> bytes:
        # The provider routes answer in their provider's shape, as the app would.
        path = bytes(getattr(self, "url", b"") or b"").split(b"?", 1)[0].decode("latin-1")
        dialect = dialect_of(path) if path else "reef"
        body = jsonfast.dumps(error_body(dialect, status, message, error_type=error_type if dialect == "reef" else None))
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n" % len(body))
        head.extend([extra_headers, b"\r\n", body])
        return b"".join(head)

    def _unsupported_upgrade_warning(self) -> None:
        # uvicorn warns twice per such request and suggests installing a WebSocket library; Reef
        # serves no WebSockets (``ws="none"``), and any client may send ``Upgrade: h2c``
        log.debug("served an upgrade request from %s as plain HTTP", self._peer())

    def send_400_response(self, msg: str) -> None:
        """Uvicorn's plain-text 400, in JSON (for any path of uvicorn's that still calls it)."""
        self._refuse(400, f"malformed HTTP request: {msg}", "bad_request")

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None
        self._header_deadline = None

    def _warn_cap(self) -> None:
        state = self._cap_state
        state["refused"] = state.get("refused", 0) + 1
        now = time.monotonic()
        if now - state.get("warned", float("-inf")) >= _CAP_WARNING_INTERVAL_S:
            log.warning("%d open connections (server.max_connections): refused %d new connection(s) since the "
                        "last warning", self.limits.max_connections, int(state["refused"]))
            state["warned"], state["refused"] = now, 0

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"


def edge_protocol(limits: EdgeLimits) -> type[EdgeHttpProtocol]:
    """A protocol class for uvicorn's ``http=`` option, bound to ``limits``."""
    return type("ReefHttpProtocol", (EdgeHttpProtocol,), {"limits": limits, "_cap_state": {}})


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config`` / ``uvicorn.run`` that apply the edge bounds.

    - ``http``: the httptools protocol bound to ``server.*`` limits (this module).
    - ``ws="none"``: Reef serves no WebSockets; an upgrade would hand the socket to a protocol
      without these bounds, so upgrade requests are served as plain HTTP (uvicorn's default
      when no WebSocket library is installed, made explicit).

    Deliberately not set: ``limit_concurrency`` (it answers 503 to requests, established
    keep-alive clients included, once the count is reached, and only after reading their
    headers, so refused clients still hold descriptors; the cap here refuses at accept) and
    ``timeout_keep_alive`` (idle time between requests stays uvicorn's default).
    """
    return {"http": edge_protocol(EdgeLimits.from_settings(settings.server)), "ws": "none"}
