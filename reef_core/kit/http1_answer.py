"""One HTTP/1.1 answer of :mod:`reef_core.kit.http1` as it arrives, and the bounds on it: the
head (``MAX_HEADER_BYTES``, ``MAX_HEADERS``; repeated fields joined once, in linear time), the
transfer coding (``chunked`` or none), the decoded body (``max_response_bytes``, through
:class:`~reef_core.kit.http_body.BodyReader`) and the reader: a streamed answer whose reader
stops taking it pauses the socket at ``PAUSE_AT`` buffered bytes and, the read timeout later,
fails and closes its connection like a silent upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from .http_body import BodyReader

PAUSE_AT = 1 << 20  # buffered body bytes at which a streamed answer stops reading the socket
#: status line and header fields of one answer (informational ones included), in bytes: twice
#: the serving side's own cap (``server.max_header_bytes``), as provider gateways send long
#: cookies and policies; nginx and Node refuse upstream heads past 4-16 KiB
MAX_HEADER_BYTES = 64 << 10
#: header fields in one answer (Apache's ``LimitRequestFields``); model servers send about 10,
#: hosted APIs behind gateways about 30
MAX_HEADERS = 100


class Stale(Exception):
    """A reused connection closed before answering: send again on a new one, if the method allows."""


class Answer:
    """One response as it arrives: the status and headers, then the body. Its connection
    (``reef_core.kit.http1``) feeds it the parser's callbacks and is told to pause, resume or
    go (``discard``)."""

    __slots__ = ("_conn", "_loop", "status", "headers", "_raw", "_buf", "_size", "_done", "_error", "_waiter",
                 "ready", "_body", "_limit", "_until_close", "_got_bytes", "_last", "_timer", "_read_s",
                 "_streaming", "_paused", "_informational", "headed", "head_room")

    def __init__(self, conn: Any, loop: asyncio.AbstractEventLoop, read_s: float | None, limit: int):
        self._conn = conn
        self._loop = loop
        self.status = 0
        self.headers: dict[str, str] = {}
        self._raw: list[tuple[bytes, bytes]] = []
        self._buf: list[bytes] = []
        self._size = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self.ready = loop.create_future()
        self._body: BodyReader | None = None
        self._limit = limit
        self._until_close = False
        self._got_bytes = False
        self._streaming = False
        self._paused = False
        self._informational = False
        self.headed = False  # the final answer's headers are complete
        #: MAX_HEADER_BYTES less every read that arrived while the head was incomplete (the
        #: connection counts them: an over-estimate only for the read in which the head ends)
        self.head_room = MAX_HEADER_BYTES
        self._read_s = read_s
        self._last = loop.time()
        self._timer = loop.call_at(self._last + read_s, self._check_timeout) if read_s else None

    # ---------------------------------------------------------------- from the connection

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw.append((name, value))

    def on_headers_complete(self, status: int) -> None:
        raw = self._raw
        self._raw = []
        if len(raw) > MAX_HEADERS:
            self.fail(httpx.RemoteProtocolError(f"the upstream sent more than {MAX_HEADERS} header fields"))
            return
        if self.head_room < 0 and sum(len(name) + len(value) for name, value in raw) > MAX_HEADER_BYTES:
            self.head_too_large()  # measured only when the reads were larger than the cap
            return
        if 100 <= status < 200:
            if status == 101:
                self.fail(httpx.RemoteProtocolError("the upstream switched protocols"))
            self._informational = True  # its message-complete is not the answer's
            return
        headers: dict[str, str] = {}
        repeated: dict[str, list[str]] | None = None
        for name, value in raw:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            if key in headers:  # joined once below: joining as they come is quadratic
                if repeated is None:
                    repeated = {}
                repeated.setdefault(key, [headers[key]]).append(text)
            else:
                headers[key] = text
        if repeated is not None:
            for key, values in repeated.items():
                headers[key] = ", ".join(values)
        self.status = status
        self.headers = headers
        self.headed = True
        coding = headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            # llhttp would take the chunks and leave the other codings undone (h11 refuses too)
            self.fail(httpx.RemoteProtocolError(f"unsupported transfer-encoding {coding[:40]!r} (only chunked)"))
            return
        try:
            self._body = BodyReader(headers.get("content-encoding"), self._limit, headers.get("content-length"))
        except httpx.HTTPError as exc:
            self.fail(exc)
            return
        self._until_close = "content-length" not in headers and coding is None and status not in (204, 304)
        if not self.ready.done():
            self.ready.set_result(None)

    def on_body(self, data: bytes) -> None:
        try:
            data = self._body.feed(data)
        except httpx.HTTPError as exc:
            self.fail(exc)
            return
        if not data:
            return
        self._buf.append(data)
        self._size += len(data)
        if self._streaming:
            if self._size >= PAUSE_AT and not self._paused:
                self._paused = True
                self._conn.pause()
            self._wake()

    def on_message_complete(self) -> bool:
        """The answer is whole; True when its connection may carry another request."""
        if self._informational:
            self._informational = False
            return False
        if self._done:  # failed while its message went on
            return False
        try:
            tail = self._body.end()
        except httpx.HTTPError as exc:
            self.fail(exc)
            return False
        if tail:
            self._buf.append(tail)
        if self._paused:  # whole while its reader lags: the connection goes on to other requests
            self._paused = False
            self._conn.resume()
        self._finish()
        return True

    def data_arrived(self) -> None:
        self._got_bytes = True
        self._last = self._loop.time()

    def head_too_large(self) -> None:
        self.fail(httpx.RemoteProtocolError(f"the upstream's headers are larger than {MAX_HEADER_BYTES} bytes"))

    def connection_lost(self, exc: BaseException | None, reused: bool) -> None:
        if self._done:
            return
        if self._until_close and exc is None and self.ready.done():
            self.on_message_complete()
        elif not self._got_bytes and reused:
            self.fail(Stale())
        elif isinstance(exc, OSError):
            self.fail(httpx.ReadError(str(exc) or type(exc).__name__))
        else:
            self.fail(httpx.RemoteProtocolError("the upstream closed the connection mid-response"
                                                if self._got_bytes else "the upstream closed the connection "
                                                "without answering"))

    def fail(self, error: BaseException) -> None:
        if self._done:
            return
        self._error = error
        self._finish()
        self._conn.discard()
        if not self.ready.done():
            self.ready.set_exception(error)
            self.ready.exception()  # retrieved: a caller may be gone

    # ---------------------------------------------------------------- internals

    def _finish(self) -> None:
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _check_timeout(self) -> None:
        """Nothing arrived for the read timeout, or (reading paused) nothing was taken: a reader
        that stops consuming a stream holds its connection no longer than a silent upstream."""
        self._timer = None
        if self._done or self._read_s is None:
            return
        now = self._loop.time()
        if now - self._last < self._read_s:
            self._timer = self._loop.call_at(self._last + self._read_s, self._check_timeout)
            return
        self.fail(httpx.ReadTimeout("the response was not read in time" if self._paused
                                    else "timed out waiting for the upstream"))

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    # ---------------------------------------------------------------- for the caller

    async def read(self) -> bytes:
        while not self._done:
            await self._wait()
        if self._error is not None:
            raise self._error
        data = b"".join(self._buf) if len(self._buf) != 1 else self._buf[0]
        self._buf = []
        return data

    async def chunks(self) -> AsyncIterator[bytes]:
        self._streaming = True
        while True:
            if self._buf:
                data = b"".join(self._buf) if len(self._buf) != 1 else self._buf[0]
                self._buf = []
                self._size = 0
                if self._paused:
                    self._paused = False
                    self._last = self._loop.time()
                    self._conn.resume()
                yield data
                continue
            if self._error is not None:
                raise self._error
            if self._done:
                return
            await self._wait()

    async def aclose(self) -> None:
        if not self._done:
            self.fail(httpx.ReadError("the response was closed before it was read"))


__all__ = ["MAX_HEADERS", "MAX_HEADER_BYTES", "PAUSE_AT", "Answer", "Stale"]
