"""The upstream transports' interface (``send`` returning an :class:`UpstreamResponse`) and
the two library-backed transports: aiohttp's connection pool (``http_transport: aiohttp``)
and httpx's (``httpx``). The default, ``reef_core.kit.http1``, has the same interface.

httpx's own pool (httpcore) spends milliseconds of CPU per request once tens of requests
are in flight (it scans every pooled connection, probing each socket, for each request):
measured here at 2.5 ms/request at concurrency 32, against 75 µs for aiohttp. Building
httpx's ``Request`` and ``Response`` objects around aiohttp cost another ~60 µs per request
(header objects, content decoders, byte chunkers), so a runtime's hot path calls
:meth:`AiohttpTransport.send` and gets an :class:`UpstreamResponse`: status, headers and
the body, whole or as it arrives. :func:`httpx_transport` gives the same interface over
httpx's own transport. Either way, failures are httpx's exception types, so callers see
one error vocabulary whichever transport runs. ``AiohttpTransport`` is also an
``httpx.AsyncBaseTransport`` for code that wants an ``httpx.AsyncClient`` on aiohttp's pool.

Every transport decodes the body itself, with :class:`~reef_core.kit.http_body.BodyReader`: the
libraries' own decoders inflate a network read whole (a gzip bomb's 1 MB becomes 1 GiB), so
aiohttp's ``auto_decompress`` is off and httpx's raw body is read; the decoded body is capped at
``max_response_bytes`` the same way on all three. The head of an answer is capped by the
libraries' parsers (aiohttp: 8190 bytes a line; httpx's h11: 16 KiB in all).
"""

from __future__ import annotations

import asyncio
import importlib.util
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx

from .http_body import DEFAULT_MAX_RESPONSE_BYTES, BodyReader

_SKIP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
_ACCEPT_ENCODING = ("accept-encoding", "gzip, deflate")

Headers = Sequence[tuple[str, str]]


def available() -> bool:
    """Whether aiohttp is installed, so ``AiohttpTransport`` can be built."""
    return importlib.util.find_spec("aiohttp") is not None


def _aiohttp() -> Any:
    """aiohttp, imported when an ``AiohttpTransport`` is used: the default transport
    (``reef_core.kit.http1``) does not need it, and importing it costs ~0.1 s and ~10 MB."""
    import aiohttp

    return aiohttp


class UpstreamResponse:
    """An answer from the upstream: ``status``, ``headers`` (lower-case names) and the body,
    read once: whole with :meth:`read` or as it arrives with :meth:`chunks` (content
    encodings already decoded). :meth:`aclose` returns the connection to the pool."""

    __slots__ = ("status", "headers", "_read", "_chunks", "_close")

    def __init__(self, status: int, headers: Mapping[str, str], read: Callable[[], Awaitable[bytes]],
                 chunks: Callable[[], AsyncIterator[bytes]], close: Callable[[], Awaitable[None]]):
        self.status = status
        self.headers = headers
        self._read, self._chunks, self._close = read, chunks, close

    async def read(self) -> bytes:
        return await self._read()

    def chunks(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def aclose(self) -> None:
        await self._close()


def _read_error(exc: BaseException) -> httpx.HTTPError:
    """httpx's exception for a failure while reading an aiohttp response body."""
    if isinstance(exc, asyncio.TimeoutError):
        return httpx.ReadTimeout(str(exc) or "timed out reading the upstream response")
    if isinstance(exc, _aiohttp().ClientPayloadError):
        return httpx.RemoteProtocolError(f"peer closed the connection mid-response ({exc})")
    return httpx.ReadError(str(exc) or type(exc).__name__)


def _aiohttp_response(response: Any, limit: int) -> UpstreamResponse:
    read_errors = (asyncio.TimeoutError, _aiohttp().ClientError)
    try:
        body = BodyReader(response.headers.get("content-encoding"), limit, response.headers.get("content-length"))
    except httpx.HTTPError:
        response.close()
        raise

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.content.iter_any():
                data = body.feed(chunk)
                if data:
                    yield data
            tail = body.end()
        except read_errors as exc:
            response.close()
            raise _read_error(exc) from None
        except httpx.HTTPError:
            response.close()
            raise
        if tail:
            yield tail

    async def read() -> bytes:
        return b"".join([chunk async for chunk in chunks()])

    async def close() -> None:
        response.release()

    return UpstreamResponse(response.status, _LowerHeaders(response.headers), read, chunks, close)


class _LowerHeaders(Mapping[str, str]):
    """aiohttp's case-insensitive headers behind a plain mapping of lower-case names."""

    __slots__ = ("_h",)

    def __init__(self, headers: Any):
        self._h = headers

    def __getitem__(self, name: str) -> str:
        return self._h[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self._h.get(name, default)

    def __iter__(self):
        return (k.lower() for k in self._h.keys())

    def __len__(self) -> int:
        return len(self._h)


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One ``aiohttp.ClientSession`` (created on first use, inside the running loop).
    ``ssl_context`` verifies ``https`` upstreams (``reef_core.kit.tls``); by default aiohttp's
    own (the system's CAs)."""

    def __init__(self, *, max_connections: int = 256, keepalive_s: float = 30.0,
                 ssl_context: ssl.SSLContext | None = None,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES):
        if not available():
            raise RuntimeError("aiohttp is not installed")
        self.max_connections = max_connections
        self.max_response_bytes = max_response_bytes
        self.keepalive_s = keepalive_s
        self.ssl_context = ssl_context
        self._session: Any = None
        self._timeouts: dict[tuple, Any] = {}

    def _get_session(self) -> Any:
        if self._session is None or self._session.closed:
            aiohttp = _aiohttp()
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                             keepalive_timeout=self.keepalive_s, ttl_dns_cache=60,
                                             ssl=self.ssl_context if self.ssl_context is not None else True)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  skip_auto_headers=("User-Agent",))
        return self._session

    def _timeout(self, timeout: Mapping[str, float | None] | None) -> Any:
        t = timeout or {}
        key = (t.get("connect"), t.get("read"), t.get("pool"))
        found = self._timeouts.get(key)
        if found is None:
            found = _aiohttp().ClientTimeout(total=None, connect=key[2], sock_connect=key[0], sock_read=key[1])
            self._timeouts[key] = found
        return found

    async def send(self, method: str, url: str, headers: Headers, body: bytes | None = None,
                   timeout: Mapping[str, float | None] | None = None) -> UpstreamResponse:
        """Send one request; the response's body is not read yet. ``timeout`` takes httpx's
        names (``connect``, ``read``, ``pool``; seconds or None)."""
        aiohttp = _aiohttp()
        # only the encodings BodyReader decodes (aiohttp would add br when brotli is installed)
        headers = [(k, v) for k, v in headers if k.lower() != "accept-encoding"] + [_ACCEPT_ENCODING]
        try:
            response = await self._get_session().request(method, url, data=body or None, headers=headers,
                                                          timeout=self._timeout(timeout), allow_redirects=False)
        except asyncio.TimeoutError as exc:
            connect_timeout = getattr(aiohttp, "ConnectionTimeoutError", None)
            if connect_timeout is not None and isinstance(exc, connect_timeout):
                raise httpx.ConnectTimeout(str(exc) or "timed out connecting") from None
            raise httpx.ReadTimeout(str(exc) or "timed out waiting for the upstream") from None
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(str(exc)) from None
        except aiohttp.ClientError as exc:
            raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__) from None
        return _aiohttp_response(response, self.max_response_bytes)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The ``httpx.AsyncBaseTransport`` interface, over :meth:`send`."""
        return await handle_with_send(self.send, request)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def handle_with_send(send: Callable[..., Awaitable[UpstreamResponse]], request: httpx.Request) -> httpx.Response:
    """An ``httpx.Request`` sent through a transport's ``send``, answered as an ``httpx.Response``
    (the ``httpx.AsyncBaseTransport`` face of the transports here and in ``http1``)."""
    headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in _SKIP_HEADERS]
    body = request.content if isinstance(request.stream, httpx.ByteStream) else await request.aread()
    try:
        answer = await send(request.method, str(request.url), headers, body, request.extensions.get("timeout"))
    except httpx.HTTPError as exc:
        exc.request = request
        raise
    # the body arrives decoded: its content-encoding no longer applies
    raw = [(k, v) for k, v in answer.headers.items() if k != "content-encoding"]
    return httpx.Response(answer.status, headers=raw, stream=_Body(answer, request), request=request,
                          extensions={"http_version": b"HTTP/1.1"})


class _Body(httpx.AsyncByteStream):
    def __init__(self, answer: UpstreamResponse, request: httpx.Request):
        self._answer = answer
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._answer.chunks():
                yield chunk
        except httpx.HTTPError as exc:
            exc.request = self._request
            raise

    async def aclose(self) -> None:
        await self._answer.aclose()


class HttpxSender:
    """:meth:`AiohttpTransport.send`'s interface over any ``httpx.AsyncBaseTransport``."""

    def __init__(self, transport: httpx.AsyncBaseTransport, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES):
        self.transport = transport
        self.max_response_bytes = max_response_bytes

    async def send(self, method: str, url: str, headers: Headers, body: bytes | None = None,
                   timeout: Mapping[str, float | None] | None = None) -> UpstreamResponse:
        request = httpx.Request(method, url, headers=list(headers), content=body,
                                extensions={"timeout": dict(timeout or {})})
        response = await self.transport.handle_async_request(request)
        headers = {k.lower(): v for k, v in response.headers.items()}
        # httpx's decoders are unbounded: the raw body is decoded here. A transport that read
        # the body already (httpx.MockTransport) left it decoded: then it is only counted.
        read_already = response.is_stream_consumed
        try:
            reader = BodyReader(None if read_already else headers.get("content-encoding"), self.max_response_bytes,
                                None if read_already else headers.get("content-length"))
        except httpx.HTTPError:
            await response.aclose()
            raise

        async def raw_chunks() -> AsyncIterator[bytes]:
            if read_already:
                yield response.content
            else:
                async for raw in response.aiter_raw():
                    yield raw

        async def chunks() -> AsyncIterator[bytes]:
            async for raw in raw_chunks():
                data = reader.feed(raw)
                if data:
                    yield data
            tail = reader.end()
            if tail:
                yield tail

        async def read() -> bytes:
            return b"".join([chunk async for chunk in chunks()])

        return UpstreamResponse(response.status_code, headers, read, chunks, response.aclose)

    async def aclose(self) -> None:
        await self.transport.aclose()


def httpx_transport(limits: httpx.Limits | None = None,
                    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                    ssl_context: ssl.SSLContext | None = None) -> HttpxSender:
    """httpx's own pooled transport behind :meth:`AiohttpTransport.send`'s interface;
    ``ssl_context`` verifies ``https`` upstreams (by default httpx's: certifi's CAs)."""
    verify: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
    return HttpxSender(httpx.AsyncHTTPTransport(limits=limits or httpx.Limits(), verify=verify), max_response_bytes)


__all__ = ["AiohttpTransport", "HttpxSender", "UpstreamResponse", "available", "httpx_transport"]
