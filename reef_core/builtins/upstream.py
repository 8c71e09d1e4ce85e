"""The ``upstream`` runtime: any OpenAI- or Anthropic-compatible HTTP endpoint.

One pooled ``httpx.AsyncClient`` (keep-alive connections, connect and read timeouts) per
runtime; with ``http_transport: auto`` (the default) its transport runs on aiohttp's pool
when aiohttp is installed, because httpx's own pool costs milliseconds of CPU per request
under concurrency (see ``reef_core.serve.http_transport``). The runtime speaks ``dialect``; the server translates clients of the other dialect.
Errors: a connection that cannot be made or times out is ``RuntimeUnavailable`` (502); an
error status from the upstream is ``RuntimeCallError`` with that status and the upstream's
message; a stream that ends without its terminal event (``data: [DONE]`` / ``message_stop``)
raises, so the server records it as incomplete.
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator

import httpx

from ..errors import RuntimeCallError, RuntimeUnavailable
from ..hookspecs import hookimpl
from ..runtime import Runtime
from ..serve import jsonfast
from ..types import InferenceCall

log = logging.getLogger("reef.upstream")

ANTHROPIC_VERSION = "2023-06-01"
_PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


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


class UpstreamRuntime(Runtime):
    """Forwards calls to an OpenAI- or Anthropic-compatible endpoint over pooled HTTP."""

    def __init__(self, upstream_url: str | None = None, api_key: str | None = None, dialect: str = "openai",
                 model: str | None = None, timeout_s: float = 300, connect_timeout_s: float = 10,
                 max_connections: int = 256, model_map: dict[str, str] | None = None,
                 default_max_tokens: int = 4096, http_transport: str = "auto"):
        if dialect not in _PATHS:
            raise ValueError(f"runtime.dialect must be 'openai' or 'anthropic', not {dialect!r}")
        if upstream_url is not None and not str(upstream_url).startswith(("http://", "https://")):
            raise ValueError(f"runtime.upstream_url must start with http:// or https://, not {upstream_url!r}")
        if http_transport not in ("auto", "aiohttp", "httpx"):
            raise ValueError(f"runtime.http_transport must be auto, aiohttp or httpx, not {http_transport!r}")
        from ..serve import http_transport as transports

        if http_transport == "aiohttp" and not transports.available():
            raise ValueError("runtime.http_transport is 'aiohttp' but aiohttp is not installed")
        self.http_transport = "aiohttp" if http_transport != "httpx" and transports.available() else "httpx"
        self.dialect = dialect
        self.upstream_url = _base_url(str(upstream_url)) if upstream_url else None
        self.model = model or None
        self.model_map = dict(model_map or {})
        self.default_max_tokens = int(default_max_tokens)
        self.timeout = httpx.Timeout(float(timeout_s), connect=float(connect_timeout_s))
        self.limits = httpx.Limits(max_connections=int(max_connections),
                                   max_keepalive_connections=int(max_connections))
        headers = {"content-type": "application/json", "accept": "application/json"}
        if dialect == "anthropic":
            headers["anthropic-version"] = ANTHROPIC_VERSION
            if api_key:
                headers["x-api-key"] = str(api_key)
        elif api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._headers = headers
        self._stream_headers = {**headers, "accept": "text/event-stream"}
        self._client: httpx.AsyncClient | None = None

    # ------------------------------------------------------------------ lifecycle

    def config_problem(self) -> str | None:
        """Why this runtime cannot serve, or None; the runner checks it before binding."""
        return None if self.upstream_url else str(UpstreamNotConfigured())

    async def start(self) -> None:
        if self.upstream_url is None:
            log.error("%s", UpstreamNotConfigured())
            return
        transport = None
        if self.http_transport == "aiohttp":
            from ..serve.http_transport import AiohttpTransport

            transport = AiohttpTransport(max_connections=self.limits.max_connections or 256)
        self._client = httpx.AsyncClient(base_url=self.upstream_url, timeout=self.timeout, limits=self.limits,
                                         headers=self._headers, transport=transport)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def models(self) -> list[str]:
        names = [self.model] if self.model else []
        return names + [m for m in self.model_map if m not in names]

    # ------------------------------------------------------------------ calls

    def _prepare(self, body: dict[str, Any]) -> bytes:
        model = self.model_map.get(body.get("model")) or self.model
        if model and body.get("model") != model:
            body = {**body, "model": model}
        return jsonfast.dumps(body)

    def _client_or_raise(self) -> httpx.AsyncClient:
        if self._client is None:
            if self.upstream_url is None:
                raise UpstreamNotConfigured()
            raise RuntimeUnavailable("the upstream runtime is not started")
        return self._client

    async def complete(self, call: InferenceCall) -> dict[str, Any]:
        client = self._client_or_raise()
        try:
            resp = await client.post(_PATHS[self.dialect], content=self._prepare(call.body))
        except httpx.TimeoutException as exc:
            raise RuntimeUnavailable(f"upstream {self.upstream_url} timed out ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"upstream {self.upstream_url} is unreachable: {exc or type(exc).__name__}") from None
        if resp.status_code >= 400:
            message, body = _error_message(resp.status_code, resp.content)
            raise RuntimeCallError(message, status=resp.status_code, body=body)
        try:
            body = jsonfast.loads(resp.content)
        except ValueError:
            raise RuntimeCallError("upstream answered with a body that is not JSON", status=502) from None
        if not isinstance(body, dict):
            raise RuntimeCallError("upstream answered with JSON that is not an object", status=502)
        return body

    async def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        client = self._client_or_raise()
        request = client.build_request("POST", _PATHS[self.dialect], content=self._prepare(call.body),
                                       headers=self._stream_headers)
        try:
            resp = await client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise RuntimeUnavailable(f"upstream {self.upstream_url} timed out ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise RuntimeUnavailable(f"upstream {self.upstream_url} is unreachable: {exc or type(exc).__name__}") from None
        try:
            if resp.status_code >= 400:
                content = await resp.aread()
                message, body = _error_message(resp.status_code, content)
                raise RuntimeCallError(message, status=resp.status_code, body=body)
            terminal = False
            async for data in _sse_data(resp):
                if data == "[DONE]":
                    terminal = True
                    break
                try:
                    event = jsonfast.loads(data)
                except ValueError:
                    raise RuntimeCallError(f"upstream sent a stream event that is not JSON: {data[:200]!r}",
                                           status=502) from None
                if not isinstance(event, dict):
                    continue
                if event.get("type") == "error" or (self.dialect == "openai" and "error" in event
                                                    and "choices" not in event):
                    err = event.get("error")
                    msg = err.get("message") if isinstance(err, dict) else err
                    raise RuntimeCallError(f"upstream stream error: {msg}", status=502, body=event)
                yield event
                if event.get("type") == "message_stop":
                    terminal = True
                    break
            if not terminal:
                raise RuntimeCallError("upstream stream ended before its final event", status=502)
        except httpx.TimeoutException as exc:
            raise RuntimeCallError(f"upstream stream timed out ({type(exc).__name__})", status=504) from None
        except httpx.HTTPError as exc:
            raise RuntimeCallError(f"upstream stream broke: {exc or type(exc).__name__}", status=502) from None
        finally:
            await resp.aclose()


async def _sse_data(resp: httpx.Response) -> AsyncIterator[str]:
    """The ``data`` field of each server-sent event (multi-line data joined with newlines)."""
    data: list[str] = []
    async for line in resp.aiter_lines():
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
        # event:, id:, retry: and comments carry nothing the dialects need (events have `type`)
    if data:
        yield "\n".join(data)


@hookimpl
def register_runtimes(register):
    register("upstream", UpstreamRuntime)
