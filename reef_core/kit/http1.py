"""The upstream hot path's default client: HTTP/1.1 keep-alive connections on asyncio
protocols, responses parsed by httptools (llhttp, Node.js's parser; already a dependency,
uvicorn parses requests with it).

Why not aiohttp's ``ClientSession``: measured against a raw stub, a pooled request/response
costs aiohttp ~59 µs of CPU at concurrency 32 and ~134 µs at concurrency 1 (its request
object, a body-writer task, per-request timeout contexts, header multidicts, a stream reader),
against 11 and 39 µs here, the most the proxy spends on any one layer it can replace.
What a model-server proxy needs is small: one request with a known-length body, a response
read whole or as it arrives, keep-alive, connect and between-reads timeouts, TLS, and the
gzip/deflate encodings. That is what this does; it is not a general HTTP client (no redirects,
proxies, cookies, ``Expect``, upgrades, ``HEAD`` or transfer codings other than ``chunked``).
``runtime.http_transport: aiohttp`` or ``httpx`` keeps either library instead.

Failures are httpx's exception types, as with the other transports: ``ConnectError``,
``ConnectTimeout``, ``PoolTimeout``, ``ReadTimeout``, ``RemoteProtocolError`` (a malformed
answer, or the server closing mid-answer), ``DecodingError``, ``ReadError``, and
:class:`~reef_core.kit.http_body.ResponseTooLarge`.

What an upstream can send is bounded: the status line and headers at most
``MAX_HEADER_BYTES`` (64 KiB) and ``MAX_HEADERS`` (100) fields, the decoded body at most
``max_response_bytes`` (:mod:`reef_core.kit.http_body`). A connection carries only answers
that were asked for: any byte that starts a message after an answer ended, or that arrives
while the connection is idle, retires the connection at once, so bytes an upstream (or
anything between) sends out of turn can never become the next request's answer. A streamed
answer its reader stops consuming (reading paused at 1 MiB buffered) times out
like a silent upstream, after the read timeout, and its connection is closed.

Which requests are sent twice: none that may have reached the upstream's application unless
the method is idempotent (GET, HEAD, PUT, DELETE, OPTIONS, TRACE; RFC 9110 §9.2.2). Before a
request goes out on a reused connection, the connection is checked without blocking: if the
upstream already closed it (its keep-alive timeout) or sent anything, it is dropped and another
one used, nothing having been sent on it. When a reused connection closes after the request was
written and before any byte of the answer, an idempotent request is sent once more on a new
connection; any other (a POST: a generation the upstream may have run and billed) fails with
``RemoteProtocolError``, never run twice. That leaves one race visible: an upstream closing an
idle connection while a POST to it is in flight (less than a round trip's window) gives a 502.
A request on a new connection is never sent twice.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httptools
import httpx

from .http1_answer import MAX_HEADER_BYTES, MAX_HEADERS, Answer, Stale
from .http_body import DEFAULT_MAX_RESPONSE_BYTES
from .http_transport import _SKIP_HEADERS as _FRAMING_HEADERS
from .http_transport import UpstreamResponse, handle_with_send

Headers = Sequence[tuple[str, str]]

# Set by the client itself: framing, and the only encodings it decodes (a caller's
# accept-encoding, e.g. httpx's "br, zstd" when those packages are installed, is replaced).
_SKIP_HEADERS = _FRAMING_HEADERS | {"accept-encoding"}
_BODILESS = frozenset({"GET", "DELETE", "OPTIONS"})  # no content-length when they carry no body
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"})  # may be sent twice
_poll = getattr(select, "poll", None)  # not on Windows: there no idle connection is probed


class _Unasked(Exception):
    """A message began on a connection with no answer pending."""


class _Target:
    __slots__ = ("key", "host", "port", "ssl", "path", "authority")

    def __init__(self, url: str, ssl_context: ssl.SSLContext | None):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise httpx.UnsupportedProtocol(f"not an http(s) URL: {parts.scheme or 'no scheme'}")
        host = parts.hostname
        default = 443 if parts.scheme == "https" else 80
        port = parts.port or default
        self.host = host
        self.port = port
        self.ssl = ssl_context if parts.scheme == "https" else None
        self.key = (parts.scheme, host, port)
        name = host.encode("idna").decode("ascii") if not host.isascii() else host
        if ":" in name:
            name = f"[{name}]"
        self.authority = name if port == default else f"{name}:{port}"
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _check_header(name: str, value: str) -> None:
    if not name or any(c in name for c in ":\r\n \t") or "\r" in value or "\n" in value:
        raise ValueError(f"invalid HTTP header {name!r}")


class _Conn(asyncio.Protocol):
    """One keep-alive connection; it carries one answer at a time, and only answers asked for."""

    def __init__(self, pool: Http1Transport, key: tuple):
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: Answer | None = None
        self.lost = False
        self.reused = False
        self.idle_since = 0.0
        self._poll: Any = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and _poll is not None:
            self._poll = _poll()
            self._poll.register(sock.fileno(), select.POLLIN)

    def data_received(self, data: bytes) -> None:
        answer = self.answer
        if answer is None:  # bytes nobody asked for: the connection's state is unknown
            self.discard()
            return
        answer.data_arrived()
        if not answer.headed:
            answer.head_room -= len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__ or exc
            answer.fail(httpx.RemoteProtocolError(f"the upstream's answer could not be read ({cause})"))
            self.discard()  # e.g. bytes past the answer's end: the parser's state is unknown
            return
        except httptools.HttpParserError as exc:
            answer.fail(httpx.RemoteProtocolError(f"the upstream sent a malformed answer ({exc})"))
            self.discard()
            return
        if self.answer is None:
            # The answer ended in this read, and nothing after it began another message (that
            # raises in on_message_begin): only now may the connection carry the next request.
            if not self.lost:
                self.pool._release(self)
        elif answer.head_room < 0 and not answer.headed:
            answer.head_too_large()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost settles the answer

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        answer, self.answer = self.answer, None
        if answer is not None:
            answer.connection_lost(exc, self.reused)
        self.pool._lost(self)

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.answer is None:
            raise _Unasked("the upstream sent a message after its answer had ended")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.answer.on_header(name, value)

    def on_headers_complete(self) -> None:
        self.answer.on_headers_complete(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self.answer.on_body(body)

    def on_message_complete(self) -> None:
        answer = self.answer
        if answer.on_message_complete() and self.answer is answer:
            self.answer = None  # released by data_received once the whole read is parsed
            if not self.parser.should_keep_alive():
                self.discard()

    # for the pool and the answer
    def has_input(self) -> bool:
        """Whether bytes or the upstream's close wait unread: on an idle connection, either
        means it can carry no request (one syscall, no blocking)."""
        return self._poll is not None and bool(self._poll.poll(0))

    def send(self, data: bytes, answer: Answer) -> None:
        self.answer = answer
        self.transport.write(data)

    def pause(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()

    def discard(self) -> None:
        """Close it for good (its answer, if any, is already settled or being failed). It
        counts as lost at once: the pool must not hand it out before asyncio reports it."""
        self.answer = None
        if self.transport is not None and not self.lost:
            self.lost = True
            self.transport.close()


class _Orphans:
    """The pool of connections left on a loop the transport no longer uses: nothing to count."""

    @staticmethod
    def _lost(conn: _Conn) -> None:
        pass

    @staticmethod
    def _release(conn: _Conn) -> None:
        conn.discard()


class Http1Transport(httpx.AsyncBaseTransport):
    """A pool of HTTP/1.1 keep-alive connections with :class:`AiohttpTransport`'s ``send``;
    also an ``httpx`` transport (``httpx.AsyncClient(transport=Http1Transport())``) for code
    written against httpx, without httpcore's pool (milliseconds of CPU per request under
    concurrency)."""

    def __init__(self, *, max_connections: int = 256, keepalive_s: float = 30.0,
                 ssl_context: ssl.SSLContext | None = None,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES):
        """``ssl_context`` verifies ``https`` upstreams; by default the system's CAs
        (``ssl.create_default_context()``). An answer whose decoded body passes
        ``max_response_bytes`` fails with ``ResponseTooLarge``."""
        self.max_connections = max_connections
        self.max_response_bytes = max_response_bytes
        self.keepalive_s = keepalive_s
        self._idle: dict[tuple, list[_Conn]] = {}
        self._open = 0  # connections open or opening
        self._waiters: deque[asyncio.Future] = deque()
        self._targets: dict[str, _Target] = {}
        self._heads: dict[tuple, bytes] = {}
        self._ssl = ssl_context
        self._conns: set[_Conn] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---------------------------------------------------------------- request

    def _target(self, url: str) -> _Target:
        target = self._targets.get(url)
        if target is None:
            if url.startswith("https:") and self._ssl is None:
                self._ssl = ssl.create_default_context()
            target = _Target(url, self._ssl)
            if len(self._targets) > 64:
                self._targets.clear()
            self._targets[url] = target
        return target

    def _head(self, method: str, target: _Target, headers: Headers) -> bytes:
        """The request line and headers, each line ending in CRLF, without ``content-length``
        and the blank line; built once per distinct request shape."""
        key = (method, target.authority, target.path, tuple(headers))
        head = self._heads.get(key)
        if head is None:
            if method == "HEAD" or not method.isalpha():
                raise ValueError(f"unsupported method {method!r}")
            lines = [f"{method} {target.path} HTTP/1.1", f"host: {target.authority}"]
            for name, value in headers:
                _check_header(name, value)
                if name.lower() not in _SKIP_HEADERS:
                    lines.append(f"{name}: {value}")
            lines.append("accept-encoding: gzip, deflate")
            head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
            if len(self._heads) > 256:
                self._heads.clear()
            self._heads[key] = head
        return head

    async def send(self, method: str, url: str, headers: Headers, body: bytes | None = None,
                   timeout: Mapping[str, float | None] | None = None) -> UpstreamResponse:
        """Send one request; the response's body is not read yet. ``timeout`` takes httpx's
        names (``connect``, ``read``, ``pool``; seconds or None)."""
        target = self._target(url)
        head = self._head(method, target, headers)
        if body or method not in _BODILESS:
            data = b"%scontent-length: %d\r\n\r\n%s" % (head, len(body or b""), body or b"")
        else:
            data = head + b"\r\n"
        t = timeout or {}
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._adopt(loop)
        for attempt in (0, 1):
            conn = await self._acquire(target, t.get("connect"), t.get("pool"), fresh=attempt > 0)
            answer = Answer(conn, loop, t.get("read"), self.max_response_bytes)
            conn.send(data, answer)
            try:
                await answer.ready
            except Stale:
                if method in _IDEMPOTENT:
                    continue
                raise httpx.RemoteProtocolError(
                    f"the upstream closed a reused connection without answering; a {method} is not "
                    "sent twice (the upstream may have run it)") from None
            except asyncio.CancelledError:
                answer.fail(httpx.ReadError("cancelled"))
                raise
            return UpstreamResponse(answer.status, answer.headers, answer.read, answer.chunks, answer.aclose)
        raise httpx.RemoteProtocolError("the upstream closed the connection without answering")

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The ``httpx.AsyncBaseTransport`` interface, over :meth:`send`."""
        return await handle_with_send(self.send, request)

    # ---------------------------------------------------------------- pool

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Connections belong to the loop that opened them: used from another loop (a test's
        new loop, a server restarted in-process), the pool starts over there. Connections of
        a loop that still runs are closed on it; those of a closed loop are already dead."""
        old, self._loop = self._loop, loop
        conns, self._conns = self._conns, set()
        self._idle.clear()
        self._waiters.clear()
        self._open = 0
        if old is not None and not old.is_closed():
            for conn in conns:
                conn.pool = _Orphans  # one still answering is closed when its answer is whole
                if conn.answer is None:
                    try:
                        old.call_soon_threadsafe(conn.discard)
                    except RuntimeError:  # closed meanwhile
                        pass

    async def _acquire(self, target: _Target, connect_s: float | None, pool_s: float | None,
                       fresh: bool = False) -> _Conn:
        loop = asyncio.get_running_loop()
        deadline = None if pool_s is None else loop.time() + pool_s
        while True:
            idle = self._idle.get(target.key)
            now = loop.time()
            while idle and not fresh:
                conn = idle.pop()
                if conn.lost or now - conn.idle_since > self.keepalive_s or conn.has_input():
                    conn.discard()  # gone, too old, or closed (or written to) by the upstream meanwhile
                    continue
                conn.reused = True
                return conn
            if self._open < self.max_connections:
                return await self._connect(target, connect_s)
            if idle and fresh:  # full, but an idle connection can make room
                idle.pop(0).discard()
                await asyncio.sleep(0)
                continue
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                if deadline is None:
                    await waiter
                else:
                    await asyncio.wait_for(waiter, max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise httpx.PoolTimeout("no connection to the upstream became free in time") from None
            finally:
                if not waiter.done():
                    waiter.cancel()

    async def _connect(self, target: _Target, connect_s: float | None) -> _Conn:
        loop = asyncio.get_running_loop()
        self._open += 1
        try:
            make = loop.create_connection(lambda: _Conn(self, target.key), target.host, target.port,
                                          ssl=target.ssl, server_hostname=target.host if target.ssl else None)
            _, conn = await (make if connect_s is None else asyncio.wait_for(make, connect_s))
        except asyncio.TimeoutError:
            self._closed_one()
            raise httpx.ConnectTimeout("timed out connecting to the upstream") from None
        except (OSError, ssl.SSLError) as exc:
            self._closed_one()
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from None
        except BaseException:
            self._closed_one()
            raise
        self._conns.add(conn)
        return conn

    def _release(self, conn: _Conn) -> None:
        conn.idle_since = asyncio.get_running_loop().time()
        idle = self._idle.setdefault(conn.key, [])
        while idle and conn.idle_since - idle[0].idle_since > self.keepalive_s:
            idle.pop(0).discard()  # the oldest idle ones, past their keep-alive
        idle.append(conn)
        self._wake_one()

    def _lost(self, conn: _Conn) -> None:
        if conn in self._conns:
            self._conns.discard(conn)
            idle = self._idle.get(conn.key)
            if idle and conn in idle:
                idle.remove(conn)
            self._closed_one()

    def _closed_one(self) -> None:
        self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        """Close every connection."""
        for conn in list(self._conns):
            if conn.answer is not None:
                conn.answer.fail(httpx.ReadError("the transport was closed"))
            conn.discard()
        self._idle.clear()
        await asyncio.sleep(0)


__all__ = ["MAX_HEADERS", "MAX_HEADER_BYTES", "Http1Transport"]
