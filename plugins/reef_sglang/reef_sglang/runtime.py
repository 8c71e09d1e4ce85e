"""``SGLangRuntime``: an SGLang (or vLLM) server as Reef's model runtime (runtime ``sglang``).

Chat requests pass through to the engine's OpenAI-compatible ``/v1/chat/completions``.
Reef adds what it needs to the forwarded body and takes it out of the answer again, so a
client sees the engine's normal OpenAI response:

* token capture (``capture_tokens``): ``logprobs: true`` and ``return_token_ids: true``,
  which both engines understand; the answer's ``prompt_token_ids`` (SGLang: on the choice;
  vLLM: top level), ``token_ids`` and per-token logprobs fill ``call.extras``;
* adapter selection: SGLang takes ``"lora_path": "<name>"`` in the body, vLLM takes the
  adapter name as ``model``.

Adapters are loaded and unloaded by versioned name (``<scenario>@<release_id>``) through the
engine's admin routes — SGLang ``POST /load_lora_adapter`` / ``/unload_lora_adapter``, vLLM
``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (the server must run with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``). Reef only *calls* these routes; it never serves
them on its own port. Put the engine on a private address (or give ``admin_url`` a separate
private one) so clients cannot load adapters themselves. ``lora_path`` must be a path the
engine's machine can read (a shared volume when the engine runs elsewhere).

Several engines (``engine_urls``), each serving the same base: every adapter load and unload
fans out to all of them, and a load counts only when every engine took it (the ones that did
unload it again otherwise), so a published adapter is served by all engines or by none and
the previous release keeps serving. Requests go to ``base_url`` when it is set (an
``sglang-router`` in front of the engines), else round-robin over the engines (an engine
that refuses the connection is skipped for that request).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from reef_core import (
    ActiveRelease,
    ConfigError,
    InferenceCall,
    Runtime,
    RuntimeCallError,
    RuntimeUnavailable,
    ServedBase,
    refuse_bad_options,
)
from reef_core.kit import (
    AdapterTable,
    Http1Transport,
    Version,
    basic_auth,
    redact_url,
    split_url_credentials,
    version_name,
)

log = logging.getLogger(__name__)

ROUTES = {
    "sglang": {"load": "/load_lora_adapter", "unload": "/unload_lora_adapter"},
    "vllm": {"load": "/v1/load_lora_adapter", "unload": "/v1/unload_lora_adapter"},
}
_ADDED = ("token_ids", "prompt_token_ids", "meta_info")
DEFAULT_URL = "http://127.0.0.1:30000"


class SGLangRuntime(Runtime):
    """Serve through an SGLang or vLLM server; hot-swap per-scenario LoRA adapters on it.

    Options (``runtime=sglang``):
        base_url: the engine's address, e.g. ``http://10.0.0.5:30000`` (no ``/v1``); with
            ``engine_urls``, the router in front of them (unset: round-robin over the engines).
        engine_urls: several engines serving the same base; adapters load on every one.
        flavor: ``sglang`` or ``vllm`` — which wire protocol the engine speaks.
        model: the served base model id; empty: the first id from ``GET /v1/models``.
        api_key: sent as ``Authorization: Bearer`` when the engine requires one. Credentials in
            ``base_url`` / ``admin_url`` (``http://user:password@host``) are sent as HTTP Basic
            auth instead; they and a key for the same URL are a configuration error.
        admin_url / admin_api_key: where the adapter routes live when not at ``base_url``.
        timeout_s / connect_timeout_s: per-request limits.
        capture_tokens: ask for token ids and logprobs and record them in ``call.extras``.
        max_connections: connection-pool size.
        base_model_path: a local directory (readable by Reef) holding the same Hugging Face
            weights and tokenizer the engine serves; weight recipes train against it
            (``reef_core.TrainableBase``). Unset: this runtime offers no base to train against.
        base_model_device: where training loads its copy of that base (``auto``: cuda when
            available, else cpu; ``cuda:1`` keeps it off the engine's GPU).

    ``call.extras``: ``prompt_token_ids`` and ``response_token_ids`` (when the engine returns
    them), ``logprobs`` (one per response token, from the engine's sampling), ``adapter``
    (``<scenario>@<release_id>`` or None for the base).

    A ``reef_core.TrainableBase`` when ``base_model_path`` is set: weight recipes then train
    against those files (the engine cannot hand out its weights), so they must be the ones it
    serves.
    """

    dialect = "openai"

    @classmethod
    def option_problems(cls, o: dict[str, Any]) -> list[str]:
        """Every problem of the option values, before a connection exists (``reef config`` asks)."""
        problems = []
        if o["flavor"] not in ROUTES:
            problems.append(f"runtime.flavor must be one of {sorted(ROUTES)}, not {o['flavor']!r}.")
        engines = [str(u) for u in (o["engine_urls"] or [])]
        if engines and o["admin_url"]:
            problems.append("runtime.admin_url is for one engine; with runtime.engine_urls each engine's own URL "
                            "takes its adapter loads (leave admin_url out)")
        if len(set(engines)) != len(engines):
            problems.append("runtime.engine_urls lists an engine twice")
        if not (o["timeout_s"] > 0 and o["connect_timeout_s"] > 0):
            problems.append("runtime.timeout_s and runtime.connect_timeout_s must be above 0 (seconds)")
        if o["max_connections"] < 1:
            problems.append("runtime.max_connections must be 1 or more")
        return problems

    def __init__(
        self,
        base_url: str | None = None,
        flavor: str = "sglang",
        model: str | None = None,
        api_key: str | None = None,
        admin_url: str | None = None,
        admin_api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        capture_tokens: bool = True,
        max_connections: int = 100,
        base_model_path: str | None = None,
        base_model_device: str = "auto",
        engine_urls: list[str] | None = None,
    ):
        refuse_bad_options(type(self), locals())
        engines = [str(u) for u in (engine_urls or [])]
        self.flavor = flavor
        self.model = model
        self.api_key = api_key
        self.admin_api_key = admin_api_key if admin_api_key is not None else api_key
        # Credentials come out of the URLs (which error messages and logs may show) into headers.
        chat_urls = [base_url] if base_url or not engines else engines
        self._chat = [self._target(u or DEFAULT_URL, api_key, "runtime.base_url" if base_url or not engines
                                   else "runtime.engine_urls") for u in chat_urls]
        admin_urls = engines or [admin_url or base_url or DEFAULT_URL]
        self._engines = [self._target(u, self.admin_api_key, "runtime.engine_urls" if engines else "runtime.admin_url")
                         for u in admin_urls]
        self.base_url, self._base_headers = self._chat[0]
        self.admin_url, self._admin_headers = self._engines[0]
        self._next_chat = itertools.cycle(range(len(self._chat)))
        self.timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self.capture_tokens = capture_tokens
        self.max_connections = max_connections
        self.base_model_path = Path(base_model_path).expanduser() if base_model_path else None
        self.base_model_device = base_model_device
        self.adapters = AdapterTable()
        self._client: httpx.AsyncClient | None = None
        self._admin_lock = asyncio.Lock()
        self._resident: set[str] = set()  # adapter names loaded on the engine by this runtime
        self._background: set[asyncio.Task] = set()

    def _target(self, url: str, key: str | None, option: str) -> tuple[str, dict[str, str]]:
        """(url without credentials, the headers to send it): URL credentials as HTTP Basic
        auth, else ``key`` as a bearer token; both at once is a configuration error."""
        clean, creds = split_url_credentials(url.rstrip("/"), option)
        if creds and key:
            raise ValueError(f"{option} carries credentials (user:password@) and an API key is set for it too; use "
                             "one of them (URL credentials are sent as HTTP Basic auth)")
        return clean, ({"Authorization": basic_auth(creds)} if creds else self._headers(key))

    @property
    def engine_urls(self) -> list[str]:
        """Where adapters load (every engine; credentials removed)."""
        return [url for url, _ in self._engines]

    # ------------------------------------------------------------------ lifecycle

    def _new_client(self) -> httpx.AsyncClient:
        """httpx's client on Reef's pooled HTTP/1.1 transport: httpx's own pool spends
        milliseconds of CPU per request once tens are in flight (docs/performance.md)."""
        return httpx.AsyncClient(timeout=self.timeout,
                                 transport=Http1Transport(max_connections=self.max_connections))

    async def start(self) -> None:
        if self._client is None:
            self._client = self._new_client()
        if self.model is None:
            data = await self._request("GET", f"{self.base_url}/v1/models", headers=self._base_headers)
            ids = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
            if not ids:
                raise RuntimeUnavailable(f"The {self.flavor} engine's /v1/models lists no model; set runtime.model.")
            self.model = ids[0]
            if len(self._engines) > 1:
                await self._check_engines()

    async def _check_engines(self) -> None:
        """Every engine must serve the base the requests name: adapters trained on one base
        and loaded on an engine serving another would answer wrongly, not fail."""
        for url, headers in self._engines:
            data = await self._request("GET", f"{url}/v1/models", headers=headers)
            ids = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
            if self.model not in ids:
                raise RuntimeUnavailable(f"The {self.flavor} engine at {redact_url(url)} does not serve "
                                         f"{self.model!r} (it lists {ids}); every runtime.engine_urls engine must "
                                         "serve the same base model.")

    async def aclose(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def models(self) -> list[str]:
        """The base model: ``runtime.model``, or the engine's first model once ``start()`` asked it.

        Never empty after start (which fails when the engine lists no model), so requests naming
        another model are refused by the kernel instead of being answered by this one. Adapters
        are Reef's to pick per scenario; clients never name them."""
        return [self.model] if self.model else []

    def serving(self) -> dict[str, dict]:
        return self.adapters.snapshot()

    # ------------------------------------------------------------------ reef_core.TrainableBase

    def trainable_problem(self) -> str | None:
        """Why weight recipes cannot train against this engine's base as configured, or None."""
        path = self.base_model_path
        if path is None:
            return ("runtime.base_model_path is not set; set it to a local directory holding the same Hugging Face "
                    "weights and tokenizer the engine serves (the directory given to --model-path) so training can "
                    "load them.")
        if not (path / "config.json").is_file():
            return (f"runtime.base_model_path={str(path)!r} is not a local Hugging Face model directory (no "
                    "config.json there); give the directory of the weights the engine serves.")
        return None

    def base_model(self) -> ServedBase:
        """The base the engine serves, from ``runtime.base_model_path`` (read from its files;
        the engine is not asked, so this works before ``start()``)."""
        problem = self.trainable_problem()
        if problem is not None:
            raise ConfigError(problem)
        path = self.base_model_path.resolve()
        return ServedBase(
            path=path,
            model_id=self.model or path.name,
            device=self.base_model_device,
            dtype=_config_dtype(path),
            eos_token_ids=_eos_token_ids(path),
        )

    def adapter_of(self, release: ActiveRelease | None) -> Path | None:
        """The release's ``adapter/`` (what ``activate`` loads on the engine), None for the base."""
        return release.adapter_dir if release is not None else None

    # ------------------------------------------------------------------ adapters

    async def activate(self, release: ActiveRelease) -> None:
        await self.start()
        adapter_dir = release.adapter_dir
        name = version_name(release.scenario, release.release_id) if adapter_dir is not None else None
        # One lock orders every load, switch and unload, including drain-time unloads, so a
        # rollback to a version that is just draining can never race its unload.
        async with self._admin_lock:
            if name is not None and name not in self._resident:
                await self._admin("load", {"lora_name": name, "lora_path": str(adapter_dir)})
                self._resident.add(name)
                log.info("loaded adapter %s on %s", name, self.admin_url)
            for old in self.adapters.activate(release.scenario, release.release_id, name):
                await self._unload_locked(old)

    async def _unload_drained(self, name: str) -> None:
        async with self._admin_lock:
            if not self.adapters.is_loaded(name):  # not revived by an activation meanwhile
                await self._unload_locked(name)

    async def _unload_locked(self, name: str) -> None:
        if name not in self._resident:
            return
        try:
            await self._admin("unload", {"lora_name": name})
            log.info("unloaded adapter %s", name)
        except RuntimeCallError as exc:  # the engine may have dropped it already (restart)
            log.warning("could not unload adapter %s: %s", name, exc)
        self._resident.discard(name)

    async def _admin(self, action: str, payload: dict[str, Any]) -> None:
        """Load or unload an adapter on every engine. A load that some engine refused is
        unloaded again from the engines that took it before the error propagates, so an
        adapter is on all engines or on none; an unload tries every engine, then raises the
        first refusal."""
        outcomes = await asyncio.gather(*(self._admin_one(url, headers, action, payload)
                                          for url, headers in self._engines), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if not failed:
            return
        if action == "load" and len(self._engines) > 1:
            took = [(url, headers) for (url, headers), o in zip(self._engines, outcomes) if not isinstance(o, BaseException)]
            for url, headers in took:
                try:
                    await self._admin_one(url, headers, "unload", {"lora_name": payload["lora_name"]})
                except RuntimeCallError as exc:
                    log.warning("could not unload the partly loaded adapter %s from %s: %s", payload["lora_name"],
                                redact_url(url), exc)
        raise failed[0]

    async def _admin_one(self, engine_url: str, headers: dict[str, str], action: str, payload: dict[str, Any]) -> Any:
        url = engine_url + ROUTES[self.flavor][action]
        where = f" at {redact_url(engine_url)}" if len(self._engines) > 1 else ""
        try:
            return await self._request("POST", url, json=payload, headers=headers)
        except RuntimeUnavailable as exc:
            raise RuntimeUnavailable(f"Cannot reach the {self.flavor} engine{where} to {action} adapter "
                                     f"{payload['lora_name']!r}: {exc}") from exc
        except RuntimeCallError as exc:
            if action == "load" and exc.status == 400 and "already" in str(exc).lower():
                # another Reef server sharing this engine loaded it: names carry the release id,
                # so the same name is the same adapter
                log.info("adapter %s was already loaded on %s", payload["lora_name"], redact_url(engine_url))
                return {}
            raise RuntimeCallError(
                f"The {self.flavor} engine{where} refused to {action} adapter {payload['lora_name']!r}: {exc}. "
                + (
                    "Check that the engine runs with LoRA enabled (SGLang: --enable-lora and --max-lora-rank; "
                    "vLLM: --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) and can read the path."
                    if action == "load"
                    else ""
                ),
                status=exc.status,
                body=exc.body,
            ) from exc

    def _release(self, version: Version) -> None:
        for name in self.adapters.release(version):
            task = asyncio.get_running_loop().create_task(self._unload_drained(name))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ inference

    async def _hold_version(self, call: InferenceCall) -> Version:
        """The adapter version ``call`` runs on: the release on the call (frozen at request
        start, or a candidate under evaluation) — loaded for the requests naming it and
        unloaded after them when it is not resident — else the scenario's active version."""
        version = self.adapters.hold_for_call(call.scenario, call.release)
        if version is not None:
            return version
        # The load runs as its own task: a caller that leaves meanwhile (a client gone, an evaluation
        # cut) must not cut it between the engine's load and this side's bookkeeping, which left the
        # adapter on the engine with nothing holding it, never unloaded; the hold it takes is given back.
        loading = asyncio.ensure_future(self._load_and_hold(call.release))
        try:
            return await asyncio.shield(loading)
        except asyncio.CancelledError:
            loading.add_done_callback(self._give_back_hold)
            raise

    async def _load_and_hold(self, release: ActiveRelease) -> Version:
        adapter_dir = release.adapter_dir
        name = version_name(release.scenario, release.release_id) if adapter_dir is not None else None
        async with self._admin_lock:
            version = self.adapters.acquire_exact(release.scenario, release.release_id)
            if version is not None:
                return version
            if name is not None and name not in self._resident:
                await self._admin("load", {"lora_name": name, "lora_path": str(adapter_dir)})
                self._resident.add(name)
            return self.adapters.hold_transient(release.scenario, release.release_id, name)

    def _give_back_hold(self, loading: asyncio.Future) -> None:
        """Done callback of a load whose caller left: release the version it held."""
        if not loading.cancelled() and loading.exception() is None:
            self._release(loading.result())

    async def _prepare(self, call: InferenceCall) -> tuple[dict[str, Any], Version, dict[str, bool]]:
        body = dict(call.body)
        asked = {"logprobs": bool(body.get("logprobs")), "token_ids": bool(body.get("return_token_ids"))}
        if "lora_path" in body:  # a client must not pick another scenario's adapter
            raise RuntimeCallError(
                "Adapters are chosen by Reef per scenario; leave lora_path out of the request.",
                status=400,
                body={
                    "error": {
                        "message": "lora_path is managed by Reef; leave it out of the request.",
                        "type": "invalid_request_error",
                        "param": "lora_path",
                        "code": None,
                    }
                },
            )
        version = await self._hold_version(call)
        body["model"] = self.model
        if version.adapter is not None:
            if self.flavor == "sglang":
                body["lora_path"] = version.adapter
            else:
                body["model"] = version.adapter
        if self.capture_tokens:
            body["logprobs"] = True
            body["return_token_ids"] = True
        call.extras["adapter"] = version.adapter
        return body, version, asked

    def _clean(self, data: dict[str, Any], asked: dict[str, bool]) -> dict[str, Any]:
        """The answer as the client would have had it without Reef's additions."""
        if "model" in data:
            data["model"] = self.model
        if not asked["token_ids"]:
            data.pop("prompt_token_ids", None)
        for choice in data.get("choices") or []:
            if not asked["token_ids"]:
                for key in _ADDED:
                    choice.pop(key, None)
            if not asked["logprobs"] and "logprobs" in choice:
                choice["logprobs"] = None
        return data

    async def complete(self, call: InferenceCall) -> dict[str, Any]:
        await self.start()
        body, version, asked = await self._prepare(call)
        body["stream"] = False
        try:
            data = await self._chat_request(body)
        finally:
            self._release(version)
        _fill_extras(call.extras, data)
        return self._clean(data, asked)

    def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        return self._stream(call)

    async def _stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        await self.start()
        body, version, asked = await self._prepare(call)
        body["stream"] = True
        logprobs: list[float] = []
        tokens: list[int] = []
        base_url, headers = self._chat[next(self._next_chat)]
        try:
            async with self._client.stream(
                "POST", f"{base_url}/v1/chat/completions", json=body, headers=headers
            ) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise _error_from(resp)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    event = json.loads(payload)
                    if "prompt_token_ids" in event:
                        call.extras["prompt_token_ids"] = event["prompt_token_ids"]
                    for choice in event.get("choices") or []:
                        if "prompt_token_ids" in choice:
                            call.extras["prompt_token_ids"] = choice["prompt_token_ids"]
                        tokens.extend(choice.get("token_ids") or [])
                        logprobs.extend(_choice_logprobs(choice))
                    yield self._clean(event, asked)
        except httpx.TransportError as exc:
            # Clients and records see no address (exception texts name host and port); the log does.
            log.warning("lost the %s engine at %s mid-stream: %s: %s", self.flavor, redact_url(base_url),
                        type(exc).__name__, exc)
            raise RuntimeUnavailable(f"Lost the {self.flavor} engine mid-stream ({type(exc).__name__})") from exc
        finally:
            self._release(version)
        if tokens:
            call.extras["response_token_ids"] = tokens
        if logprobs:
            call.extras["logprobs"] = logprobs

    # ------------------------------------------------------------------ http

    async def _chat_request(self, body: dict[str, Any]) -> Any:
        """POST a chat body to the next engine (or the router); an engine that refuses the
        connection (the request never reached it) hands the request to the next one."""
        first = next(self._next_chat)
        order = [(first + i) % len(self._chat) for i in range(len(self._chat))]
        for i in order[:-1]:
            url, headers = self._chat[i]
            try:
                return await self._request("POST", f"{url}/v1/chat/completions", json=body, headers=headers,
                                           skippable=True)
            except _Skipped:
                continue
        url, headers = self._chat[order[-1]]
        return await self._request("POST", f"{url}/v1/chat/completions", json=body, headers=headers)

    def _unreachable(self, url: str, exc: httpx.TransportError) -> RuntimeUnavailable:
        # Clients and records see no address (exception texts name host and port); the log does.
        log.warning("cannot reach the %s engine at %s: %s: %s", self.flavor, redact_url(url), type(exc).__name__, exc)
        return RuntimeUnavailable(
            f"Cannot reach the {self.flavor} engine ({type(exc).__name__}). Check runtime.base_url and that the "
            "engine is up."
        )

    def _headers(self, key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _request(self, method: str, url: str, *, skippable: bool = False, **kwargs: Any) -> Any:
        if self._client is None:
            self._client = self._new_client()
        try:
            resp = await self._client.request(method, url, **kwargs)
        except httpx.ConnectError as exc:
            if skippable:
                log.warning("the %s engine at %s refused the connection; trying the next one: %s", self.flavor,
                            redact_url(url), exc)
                raise _Skipped from exc
            raise self._unreachable(url, exc) from exc
        except httpx.TransportError as exc:
            raise self._unreachable(url, exc) from exc
        if resp.status_code >= 400:
            raise _error_from(resp)
        if not resp.content:
            return {}
        try:
            return resp.json()
        except ValueError:
            return {"text": resp.text}


class _Skipped(Exception):
    """An engine refused the connection and another one can take the request."""


def _error_from(resp: httpx.Response) -> RuntimeCallError:
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = body["error"].get("message") or resp.text
    elif isinstance(body, dict) and "message" in body:  # SGLang's ErrorResponse / plain admin errors
        message = str(body["message"])
        body = {
            "error": {
                "message": message,
                "type": body.get("type", "invalid_request_error"),
                "param": body.get("param"),
                "code": body.get("code"),
            }
        }
    else:
        message = resp.text or resp.reason_phrase
        body = {"error": {"message": message, "type": "upstream_error", "param": None, "code": None}}
    return RuntimeCallError(f"engine answered {resp.status_code}: {message}", status=resp.status_code, body=body)


def _choice_logprobs(choice: dict[str, Any]) -> list[float]:
    lp = choice.get("logprobs")
    if isinstance(lp, dict):
        if isinstance(lp.get("content"), list):
            return [float(e["logprob"]) for e in lp["content"] if isinstance(e, dict) and "logprob" in e]
        if isinstance(lp.get("token_logprobs"), list):
            return [float(x) for x in lp["token_logprobs"] if x is not None]
    return []


def _fill_extras(extras: dict[str, Any], data: dict[str, Any]) -> None:
    choices = data.get("choices") or []
    choice = choices[0] if choices else {}
    prompt = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
    if prompt is not None:
        extras["prompt_token_ids"] = prompt
    if choice.get("token_ids") is not None:
        extras["response_token_ids"] = choice["token_ids"]
    logprobs = _choice_logprobs(choice)
    if logprobs:
        extras["logprobs"] = logprobs


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _config_dtype(model_dir: Path) -> str | None:
    config = _read_json(model_dir / "config.json")
    dtype = config.get("dtype") or config.get("torch_dtype")  # newer transformers write ``dtype``
    return dtype if isinstance(dtype, str) else None


def _eos_token_ids(model_dir: Path) -> tuple[int, ...]:
    """End-of-turn ids of an HF directory as transformers would see them, without loading it:
    ``generation_config.json``'s ``eos_token_id`` (else ``config.json``'s) and the tokenizer's
    ``eos_token`` (looked up among ``tokenizer_config.json``'s added tokens)."""
    ids: set[int] = set()
    generation = _read_json(model_dir / "generation_config.json") or _read_json(model_dir / "config.json")
    tokenizer = _read_json(model_dir / "tokenizer_config.json")
    eos = tokenizer.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    added = tokenizer.get("added_tokens_decoder")
    tokenizer_eos = next((int(i) for i, t in added.items() if isinstance(t, dict) and t.get("content") == eos),
                         None) if isinstance(added, dict) and eos else None
    for value in (generation.get("eos_token_id"), tokenizer_eos):
        if isinstance(value, int) and not isinstance(value, bool):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value if isinstance(v, int) and not isinstance(v, bool))
    return tuple(sorted(ids))
