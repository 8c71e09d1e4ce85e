"""The ``upstream`` runtime: any OpenAI- or Anthropic-compatible HTTP endpoint.

Requests go through one pooled transport per runtime (keep-alive connections, connect and
read timeouts). With ``http_transport: auto`` (the default) or ``http1`` that is Reef's own
HTTP/1.1 client (``reef_core.kit.http1``: asyncio protocols and httptools, a fifth of
aiohttp's CPU per request); ``aiohttp`` and ``httpx`` choose those libraries' pools
(``reef_core.kit.http_transport``; httpx's own costs milliseconds of CPU per request under
concurrency). The runtime speaks
``dialect`` (``openai``, ``anthropic`` or ``responses``: ``POST /v1/responses``, whose streams end
with ``response.completed``/``incomplete``/``failed``); the server translates clients of the others.
Errors: a connection that cannot be made or times out is ``RuntimeUnavailable`` (502); an
error status from the upstream is ``RuntimeCallError`` with that status and the upstream's
message (an error object answered with a success status, as some gateways do, is such an
error too, with status 502), and its ``retry-after`` / ``retry-after-ms`` headers go to the client
with it; a stream that ends without its terminal event (``data: [DONE]`` / ``message_stop``)
raises, so the server records it as incomplete. An error event inside a stream raises after
the events that arrived before it were yielded, so the partial answer reaches the client.
An answer whose decoded body passes ``max_response_bytes`` (64 MiB by default; streamed or
not, the record keeps all of it) is a 502 that names the setting.

The upstream's address never appears in an error: error messages reach clients and records
(which any valid token may read), so they say "the upstream model server is unreachable"
and the server log (operators) names the host, without credentials. Credentials written into
``upstream_url`` (``https://user:password@host/v1``) are taken out of the URL and sent as
HTTP Basic auth (what ``user:password@`` means for HTTP, as in curl and httpx); a bearer key
belongs in ``api_key``, and setting both is a configuration error.
Nor do the credentials themselves: ``api_key`` and URL credentials quoted in an upstream's error (some
echo the key they were sent) are replaced with ``[redacted]`` in the error's message and body.

TLS: one ``ssl.SSLContext`` (``reef_core.kit.tls``), built in the constructor from
``upstream_ca_bundle``, ``upstream_client_cert``/``upstream_client_key`` and
``upstream_verify``, goes to whichever transport runs, so they all trust the same CAs. A bad
option is a configuration error at start-up; ``upstream_verify: false`` logs a warning at
every start. A TLS handshake that fails (unknown CA, wrong host name, a client certificate the
upstream wants and does not get) is a connection failure like any other: 502.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx

from ..contracts import Runtime, refuse_bad_options
from ..errors import RuntimeCallError, RuntimeUnavailable
from ..hookspecs import hookimpl
from ..kit import jsonfast
from ..kit.http_body import DEFAULT_MAX_RESPONSE_BYTES, ResponseTooLarge
from ..kit.http_transport import UpstreamResponse
from ..kit.tls import client_ssl_context
from ..kit.urls import basic_auth, redact_url, split_url_credentials
from ..types import InferenceCall

log = logging.getLogger("reef.upstream")

ANTHROPIC_VERSION = "2023-06-01"
_PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}
#: the events that end a Responses stream (the others end with ``data: [DONE]`` / ``message_stop``)
_RESPONSES_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class UpstreamNotConfigured(RuntimeCallError):
    """``runtime.upstream_url`` is not set."""

    def __init__(self) -> None:
        super().__init__("this Reef has no upstream model: set runtime.upstream_url "
                         "(or REEF_UPSTREAM_URL) to an OpenAI- or Anthropic-compatible endpoint",
                         status=503)


def _base_url(url: str) -> str:
    """Accept the endpoint with or without its ``/v1`` suffix."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _error_message(status: int, content: bytes) -> tuple[str, dict[str, Any] | None]:
    try:
        body = jsonfast.loads(content)
    except ValueError:
        text = content.decode("utf-8", "replace").strip()[:500]
        return f"upstream answered {status}: {text or 'no body'}", None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"]), body
    if isinstance(err, str):
        return err, body
    return f"upstream answered {status}", body if isinstance(body, dict) else None


def _upstream_error(resp: UpstreamResponse, content: bytes) -> RuntimeCallError:
    """The error an upstream's error answer is for the client: its status and message, except
    that a refusal of Reef's own credentials (401, 403) is a 502 saying so. Relayed as is, it read
    as the client's key refused: SDKs raise an authentication error and agents ask their user to
    log in again, while the key to fix is ``runtime.api_key``."""
    message, body = _error_message(resp.status, content)
    if resp.status in (401, 403):
        return RuntimeCallError(f"the upstream refused Reef's own credentials with {resp.status} (check "
                                f"runtime.api_key and its access to the model): {message}", status=502)
    return RuntimeCallError(message, status=resp.status, body=body, headers=_retry_headers(resp))


#: the list every whole answer of the upstream's API holds
_ANSWER_LIST = {"openai": "choices", "anthropic": "content", "responses": "output"}

#: an upstream error's headers relayed to the client: when to retry (both SDKs wait on them)
_RETRY_HEADERS = ("retry-after", "retry-after-ms")


def _retry_headers(resp: UpstreamResponse) -> dict[str, str] | None:
    """``retry-after`` and ``retry-after-ms`` of an error answer, when it has them and they are
    short numbers or dates (nothing else of the upstream's headers reaches the client)."""
    found = {name: value.strip() for name in _RETRY_HEADERS
             if isinstance(value := resp.headers.get(name), str) and 0 < len(value.strip()) <= 64
             and value.isprintable()}
    return found or None


def _redact(value: Any, secrets: list[str]) -> Any:
    """``value`` (text, or JSON of dicts and lists) with every one of ``secrets`` replaced."""
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, "[redacted]")
        return value
    if isinstance(value, dict):
        return {_redact(k, secrets): _redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, secrets) for v in value]
    return value


def _address_problem(url: str) -> str | None:
    """What keeps ``url`` from being an address a request can go to (no host, a port out of
    range, one that does not parse), or None: such a URL passes httpx's parser and fails every
    request instead."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError past 65535
    except ValueError:
        return "does not parse (a port out of range, or a malformed host)"
    if not parts.hostname:
        return "names no host"
    if port == 0:
        return "has port 0"
    return None


class UpstreamRuntime(Runtime):
    """Forwards calls to an OpenAI- or Anthropic-compatible endpoint over pooled HTTP."""

    @classmethod
    def option_problems(cls, o: dict[str, Any]) -> list[str]:
        """Every problem of the option values, before a connection pool exists (``reef config`` asks)."""
        problems = []
        if o["dialect"] not in _PATHS:
            problems.append(f"runtime.dialect must be 'openai', 'anthropic' or 'responses', not {o['dialect']!r}")
        url = o["upstream_url"]
        if url is not None:
            url = str(url)
            if not url.startswith(("http://", "https://")):
                # Only the scheme is quoted: the rest of the URL may hold a password.
                found = f"scheme {url.split('://', 1)[0][:16]!r}" if "://" in url else "no scheme"
                problems.append(f"runtime.upstream_url must start with http:// or https:// (it has {found})")
            elif (where := _address_problem(url)) is not None:
                problems.append(f"runtime.upstream_url is not a valid URL: it {where} (not shown here: it may "
                                "contain credentials)")
            elif split_url_credentials(url)[1] and o["api_key"]:
                problems.append("runtime.upstream_url carries credentials (user:password@) and runtime.api_key "
                                "is set too; use one of them (URL credentials are sent as HTTP Basic auth)")
        size = o["max_response_bytes"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            problems.append(f"runtime.max_response_bytes must be a positive number of bytes, not {size!r}")
        if not (o["timeout_s"] > 0 and o["connect_timeout_s"] > 0):
            problems.append("runtime.timeout_s and runtime.connect_timeout_s must be above 0 (seconds)")
        if o["max_connections"] < 1 or o["default_max_tokens"] < 1:
            problems.append("runtime.max_connections and runtime.default_max_tokens must be 1 or more")
        tls = {k: o.get(f"upstream_{k}") for k in ("ca_bundle", "client_cert", "client_key", "client_key_password")}
        if any(tls.values()) or o.get("upstream_verify") is False:
            try:  # the files read as the runtime will read them (a missing CA bundle, a key without its cert)
                client_ssl_context(**tls, verify=bool(o.get("upstream_verify", True)))
            except ValueError as exc:
                problems.append(str(exc))
        transport = o["http_transport"]
        if transport not in ("auto", "http1", "aiohttp", "httpx"):
            problems.append(f"runtime.http_transport must be auto, http1, aiohttp or httpx, not {transport!r}")
        elif transport == "aiohttp":
            from ..kit import http_transport as transports

            if not transports.available():
                problems.append("runtime.http_transport is 'aiohttp' but aiohttp is not installed")
        return problems

    def __init__(self, upstream_url: str | None = None, api_key: str | None = None, dialect: str = "openai",
                 model: str | None = None, timeout_s: float = 300, connect_timeout_s: float = 10,
                 max_connections: int = 256, model_map: dict[str, str] | None = None,
                 default_max_tokens: int = 4096, http_transport: str = "auto",
                 upstream_ca_bundle: str | None = None, upstream_client_cert: str | None = None,
                 upstream_client_key: str | None = None, upstream_client_key_password: str | None = None,
                 upstream_verify: bool = True,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES):
        refuse_bad_options(type(self), locals())
        credentials = None
        if upstream_url is not None:
            upstream_url, credentials = split_url_credentials(str(upstream_url))
        self.max_response_bytes = max_response_bytes
        self.http_transport = "http1" if http_transport == "auto" else http_transport
        self.dialect = dialect
        self.upstream_url = _base_url(upstream_url) if upstream_url else None
        #: where the upstream is, for the server log only (never in errors: clients read those)
        self.where = redact_url(self.upstream_url) if self.upstream_url else None
        self.model = model or None
        self.model_map = dict(model_map or {})
        self.default_max_tokens = int(default_max_tokens)
        self.timeout = httpx.Timeout(float(timeout_s), connect=float(connect_timeout_s))
        self._url = f"{self.upstream_url}{_PATHS[dialect]}" if self.upstream_url else None
        self.limits = httpx.Limits(max_connections=int(max_connections),
                                   max_keepalive_connections=int(max_connections))
        headers = {"content-type": "application/json", "accept": "application/json"}
        if dialect == "anthropic":
            headers["anthropic-version"] = ANTHROPIC_VERSION
            if api_key:
                headers["x-api-key"] = str(api_key)
        elif api_key:
            headers["authorization"] = f"Bearer {api_key}"
        if credentials:
            headers["authorization"] = basic_auth(credentials)
        #: what an upstream error must not carry to clients and records (an upstream may quote the
        #: key it was sent: "Incorrect API key provided: sk-…"); short values are left alone
        self._secrets = sorted({v for v in (str(api_key) if api_key else None, *(credentials or ()),
                                            headers.get("authorization", "").partition(" ")[2] or None)
                                if v and len(v) >= 6}, key=len, reverse=True)
        self._headers = list(headers.items())
        self._stream_headers = list({**headers, "accept": "text/event-stream"}.items())
        self._timeout_ext = self.timeout.as_dict()
        self._transport: Any = None  # Http1Transport, AiohttpTransport or httpx_transport(): one ``send``
        self.upstream_verify = bool(upstream_verify)
        tls_options = any((upstream_ca_bundle, upstream_client_cert, upstream_client_key,
                           upstream_client_key_password, not self.upstream_verify))
        self._tls_unused = tls_options and not (self.upstream_url or "").startswith("https:")
        #: the one TLS context of every transport (None: the upstream is plain http, no TLS option set)
        self.ssl_context: ssl.SSLContext | None = None
        if tls_options or (self.upstream_url or "").startswith("https:"):
            self.ssl_context = client_ssl_context(
                ca_bundle=upstream_ca_bundle, client_cert=upstream_client_cert, client_key=upstream_client_key,
                client_key_password=upstream_client_key_password, verify=self.upstream_verify)

    # ------------------------------------------------------------------ lifecycle

    def config_problem(self) -> str | None:
        """Why this runtime cannot serve, or None; the runner checks it before binding."""
        return None if self.upstream_url else str(UpstreamNotConfigured())

    async def start(self) -> None:
        if self.upstream_url is None:
            log.error("%s", UpstreamNotConfigured())
            return
        self._warn_about_tls()
        if self.http_transport == "http1":
            from ..kit.http1 import Http1Transport

            self._transport = Http1Transport(max_connections=self.limits.max_connections or 256,
                                             ssl_context=self.ssl_context,
                                             max_response_bytes=self.max_response_bytes)
        elif self.http_transport == "aiohttp":
            from ..kit.http_transport import AiohttpTransport

            self._transport = AiohttpTransport(max_connections=self.limits.max_connections or 256,
                                               ssl_context=self.ssl_context,
                                               max_response_bytes=self.max_response_bytes)
        else:
            from ..kit.http_transport import httpx_transport

            self._transport = httpx_transport(self.limits, self.max_response_bytes, ssl_context=self.ssl_context)

    def _warn_about_tls(self) -> None:
        """Never silently: TLS options that do nothing, or a certificate nobody checks."""
        if self._tls_unused:
            log.warning("runtime.upstream_url %s is plain http: the runtime.upstream_* TLS options have no effect",
                        self.where)
        elif not self.upstream_verify:
            log.warning("runtime.upstream_verify is false: the TLS certificate of the upstream %s is not checked, "
                        "so anyone on the network path can read and change requests and answers; set "
                        "runtime.upstream_ca_bundle to the upstream's CA instead", self.where)

    async def aclose(self) -> None:
        if self._transport is not None:
            await self._transport.aclose()
            self._transport = None

    def models(self) -> list[str]:
        """``model``, then the ``model_map`` names. Empty when neither is set: the runtime is then a
        pass-through proxy, any name goes upstream and the upstream answers unknown ones."""
        names = [self.model] if self.model else []
        return names + [m for m in self.model_map if m not in names]

    # ------------------------------------------------------------------ calls

    def _request(self, body: dict[str, Any]) -> bytes:
        """The request body to send, with the upstream's model name. URL, headers and timeouts
        are built once: ``httpx.AsyncClient``'s per-request layer (URL and header merging,
        cookies, auth and redirect handling) costs ~150 µs of CPU and none of it applies."""
        if self._transport is None:
            if self.upstream_url is None:
                raise UpstreamNotConfigured()
            raise RuntimeUnavailable("the upstream runtime is not started")
        # Only served names get here (the kernel refuses others): a model_map name goes as its
        # upstream name, a request without a model gets `model`, any other name goes as it is.
        name = body.get("model")
        model = self.model if name is None else self.model_map.get(name, name)
        if model is not None and model != name:
            body = {**body, "model": model}
        return jsonfast.dumps(body)

    def _unavailable(self, what: str, exc: Exception) -> RuntimeUnavailable:
        """The client-facing error for a transport failure: what happened and the exception's
        type, never the address (the exception's text often names host and port). The
        server log names the host for operators."""
        log.warning("upstream %s %s: %s: %s", self.where, what, type(exc).__name__, exc)
        return RuntimeUnavailable(f"the upstream model server {what} ({type(exc).__name__})")

    def _too_large(self, exc: ResponseTooLarge) -> RuntimeCallError:
        log.warning("upstream %s answered more than runtime.max_response_bytes (%d)", self.where, exc.limit)
        return RuntimeCallError(f"the upstream model server's answer is larger than runtime.max_response_bytes "
                                f"({exc.limit} bytes decoded); it was dropped", status=502)

    async def _send(self, body: dict[str, Any], headers: list[tuple[str, str]]) -> UpstreamResponse:
        content = self._request(body)
        try:
            return await self._transport.send("POST", self._url, headers, content, self._timeout_ext)
        except ResponseTooLarge as exc:
            raise self._too_large(exc) from None
        except httpx.TimeoutException as exc:
            raise self._unavailable("timed out", exc) from None
        except httpx.HTTPError as exc:
            raise self._unavailable("is unreachable", exc) from None

    def _redacted(self, exc: RuntimeCallError) -> RuntimeCallError:
        """``exc`` with the runtime's own credentials taken out of its message and body."""
        if self._secrets:
            exc.args = tuple(_redact(a, self._secrets) for a in exc.args)
            exc.body = _redact(exc.body, self._secrets)
        return exc

    async def complete(self, call: InferenceCall) -> dict[str, Any]:
        try:
            return await self._answer(await self._send(call.body, self._headers))
        except RuntimeCallError as exc:
            raise self._redacted(exc) from None

    async def retrieve(self, response_id: str) -> dict[str, Any]:
        """``GET /v1/responses/{id}`` at a Responses upstream: a response the provider stored
        (``runtime.dialect: responses`` only). Errors are the upstream's, as for ``complete``."""
        if self.dialect != "responses":
            raise RuntimeCallError("the upstream does not speak the Responses API (runtime.dialect)", status=404)
        if self._transport is None:
            self._request({})  # raises the reason: not configured, or not started
        quoted = quote(response_id, safe="")
        try:
            resp = await self._transport.send("GET", f"{self._url}/{quoted}", self._headers, None, self._timeout_ext)
        except httpx.TimeoutException as exc:
            raise self._unavailable("timed out", exc) from None
        except httpx.HTTPError as exc:
            raise self._unavailable("is unreachable", exc) from None
        try:
            return await self._answer(resp)
        except RuntimeCallError as exc:
            raise self._redacted(exc) from None

    async def _answer(self, resp: UpstreamResponse) -> dict[str, Any]:
        """The JSON object of a whole (non-streamed) upstream answer, or the error it is."""
        try:
            content = await resp.read()
        except ResponseTooLarge as exc:
            raise self._too_large(exc) from None
        except httpx.TimeoutException as exc:
            raise self._unavailable("timed out", exc) from None
        except httpx.HTTPError as exc:
            raise self._unavailable("broke the response", exc) from None
        finally:
            await resp.aclose()
        if resp.status >= 400:
            raise _upstream_error(resp, content)
        try:
            body = jsonfast.loads(content)
        except ValueError:
            raise RuntimeCallError("upstream answered with a body that is not JSON", status=502) from None
        if not isinstance(body, dict):
            raise RuntimeCallError("upstream answered with JSON that is not an object", status=502)
        if (message := self._error_in(body)) is not None:
            # an error answered with a success status (some gateways do): an error, as the same
            # object inside a stream is, not an empty answer recorded as ok
            raise RuntimeCallError(f"upstream answered {resp.status} with an error: {message}", status=502, body=body)
        key = _ANSWER_LIST[self.dialect]
        if not isinstance(body.get(key), list):
            # ``{}`` or a gateway's own status object: relayed, it read as an empty answer recorded as ok
            raise RuntimeCallError(f"upstream answered {resp.status} with JSON that is no answer of its API "
                                   f"(it has no {key!r} list)", status=502)
        return body

    async def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        async for batch in self.stream_batches(call):
            for event in batch:
                yield event

    async def stream_batches(self, call: InferenceCall) -> AsyncIterator[list[dict[str, Any]]]:
        """The stream as it arrives off the network: each item holds every event one read
        returned. The server writes one batch in one socket write (an optional extension of
        the runtime contract: ``stream`` is the per-event form)."""
        resp = await self._send(call.body, self._stream_headers)
        try:
            if resp.status >= 400:
                raise _upstream_error(resp, await resp.read())
            terminal = ended = False
            # After the terminal event the rest of the body is still read to its end (it is
            # already buffered), so the pooled connection is kept alive instead of closed.
            async for blocks in _sse_batches(resp):
                batch = []
                for data in blocks:
                    if ended:
                        break
                    if data == b"[DONE]" or (len(data) < 16 and data.strip() == b"[DONE]"):  # stray whitespace too
                        # the end of a chat stream; a Responses stream's end is its response event, so
                        # one cut before it that a proxy ended with [DONE] is still incomplete
                        ended = True
                        terminal = terminal or self.dialect != "responses"
                        break
                    try:
                        event = self._event(data)
                    except RuntimeCallError:
                        # An error event arriving in the same network read as the events before
                        # it: those still reach the client (and the record) first, so the server
                        # ends the stream with an in-band error instead of a plain error answer.
                        if batch:
                            yield batch
                        raise
                    if event is None:
                        continue
                    if event.get("type") == "message_stop" or event.get("type") in _RESPONSES_TERMINAL:
                        terminal = ended = True
                    batch.append(event)
                if batch:
                    yield batch
            if not terminal:
                raise RuntimeCallError("upstream stream ended before its final event", status=502)
        except RuntimeCallError as exc:
            raise self._redacted(exc) from None
        except ResponseTooLarge as exc:
            raise self._too_large(exc) from None
        except httpx.TimeoutException as exc:
            log.warning("upstream %s stream timed out: %s: %s", self.where, type(exc).__name__, exc)
            raise RuntimeCallError(f"upstream stream timed out ({type(exc).__name__})", status=504) from None
        except httpx.HTTPError as exc:
            log.warning("upstream %s stream broke: %s: %s", self.where, type(exc).__name__, exc)
            raise RuntimeCallError(f"upstream stream broke ({type(exc).__name__})", status=502) from None
        finally:
            await resp.aclose()

    def _event(self, data: bytes) -> dict[str, Any] | None:
        try:
            event = jsonfast.loads(data)
        except ValueError:
            raise RuntimeCallError(f"upstream sent a stream event that is not JSON: {data[:200]!r}",
                                   status=502) from None
        if not isinstance(event, dict):
            return None
        if (msg := self._error_in(event)) is not None:
            raise RuntimeCallError(f"upstream stream error: {msg}", status=502, body=event)
        return event

    def _error_in(self, body: dict[str, Any]) -> str | None:
        """The message of ``body`` when it is an error object rather than an answer (or a stream
        event) of the dialect: ``{"type": "error", ...}`` in any, an ``error`` without
        ``choices`` from a Chat Completions upstream; else None."""
        if not (body.get("type") == "error" or (self.dialect == "openai" and "error" in body
                                                 and "choices" not in body)):
            return None
        err = body.get("error")
        msg = err.get("message") if isinstance(err, dict) else err or body.get("message")
        return str(msg)


async def _sse_batches(resp: UpstreamResponse) -> AsyncIterator[list[bytes]]:
    """The ``data`` field of each server-sent event (multi-line data joined with newlines),
    grouped by network read.

    Works on raw bytes, splitting events on blank lines: much cheaper than decoding and
    line-splitting text, and orjson parses bytes directly. ``event:``, ``id:``, ``retry:``
    and comments carry nothing the dialects need (every event names its ``type``).

    Linear in the stream's size whatever its shape: each read is scanned once, and the pieces
    of an unfinished event are joined only when a blank line ends it (re-scanning and
    re-copying a growing buffer per read is quadratic: an upstream sending one endless event
    in small reads would hold the event loop for minutes).
    """
    pending: list[bytes] = []  # the unfinished event, in pieces, line ends already \n
    carry = b""  # a \r that ended the last read: the start of \r\n or a line end of its own
    async for chunk in resp.chunks():
        if carry:
            chunk, carry = carry + chunk, b""
        if b"\r" in chunk:
            if chunk.endswith(b"\r"):
                chunk, carry = chunk[:-1], b"\r"
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if not chunk:
            continue
        if b"\n\n" not in chunk and not (pending and pending[-1].endswith(b"\n") and chunk.startswith(b"\n")):
            pending.append(chunk)
            continue
        pending.append(chunk)
        *blocks, rest = b"".join(pending).split(b"\n\n")
        pending = [rest] if rest else []
        found = [data for data in map(_data_of, blocks) if data is not None]
        if found:
            yield found
    data = _data_of(b"".join(pending) + (b"\n" if carry else b""))
    if data is not None:
        yield [data]


def _data_of(block: bytes) -> bytes | None:
    lines = [ln[5:].removeprefix(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


@hookimpl
def register_runtimes(register):
    register("upstream", UpstreamRuntime)
