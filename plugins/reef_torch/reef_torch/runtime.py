"""``LocalRuntime``: serve a causal LM in-process with transformers + peft (runtime ``local``).

The constructor's keyword arguments are the ``runtime=local`` config schema
(``reef_torch/conf/runtime/local.yaml``). Heavy imports (torch, transformers, peft) happen
in ``start()``, so loading the plugin to list it costs nothing.

Adapter hot swap: ``activate(release)`` loads ``release.adapter_dir`` under the versioned
name ``<scenario>@<release_id>`` on the engine's worker thread (between two decode steps),
then switches the scenario's serving version atomically in the ``AdapterTable``. Requests
in flight keep the version they started on; the retired version is deleted from the model
once its last request leaves the batch. A release without ``adapter/`` serves the base model.
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from reef_core import (
    ActiveRelease,
    InferenceCall,
    Runtime,
    RuntimeCallError,
    RuntimeUnavailable,
    ServedBase,
    StartupError,
    refuse_bad_options,
)
from reef_core.kit import AdapterTable, Version, version_name
from reef_train.prompts import chat_prompt_ids

from .model_loading import EMBEDDED_ALIASES, EMBEDDED_MODEL_ID, ModelLoadError
from .openai_format import (
    chunk,
    completion_body,
    invalid,
    new_completion_id,
    parse_chat_request,
    prompt_too_long,
    token_logprobs,
)

log = logging.getLogger(__name__)

_END = object()


class ModelNotLoadable(StartupError, ModelLoadError):
    """``start()`` could not load the configured model; the message names the fix.

    A ``StartupError``, so ``reef serve`` prints that sentence as one line and exits 2, and still
    a ``ModelLoadError`` for code that catches what ``reef_torch.model_loading`` raises.
    """


class LocalRuntime(Runtime):
    """A transformers + peft model served with dynamic batching and per-scenario LoRA adapters.

    A ``reef_core.TrainableBase``: weight recipes train against the served model through
    ``base_model()`` and ``adapter_of(release)`` (with ``reef_train.load_trainable``).

    Options (``runtime=local``):
        model: local HF model directory; empty for the embedded SmolLM2-135M-Instruct.
        cache_dir: where the embedded model's conversion is cached
            (default ``$REEF_MODEL_CACHE`` or ``~/.cache/reef/models``).
        device: ``auto`` (cuda when available, else cpu), ``cpu``, ``cuda``, ``cuda:1`` …
        dtype: ``auto`` (bfloat16 on cuda, float32 on cpu), ``float32``, ``bfloat16``, ``float16``.
        max_batch_size: most sequences decoded together.
        batch_window_ms: how long an idle engine waits for more requests to batch.
        max_new_tokens_default: completion length when the request sets no max_tokens.
        max_context_tokens: most tokens (prompt and completion) of one conversation; empty for the
            model's context (``max_position_embeddings``). A longer prompt is refused with a 400.
        prefill_chunk_tokens: most prompt tokens (padding included) one prefill forward takes.

    ``call.extras`` after a call: ``prompt_token_ids``, ``response_token_ids`` (every sampled
    token, including the final end-of-turn token), ``logprobs`` (one per response token; see
    ``reef_train.sampling`` for the convention), ``logprobs_temperature`` (the temperature
    they were taken at), ``adapter`` (``<scenario>@<release_id>`` or None for the base),
    ``finish_reason``; and ``top_logprobs`` (per response token the ``call.top_logprobs`` most
    likely tokens as ``[token_id, logprob]``, same convention) only when the call asks for them
    (its scenario's recipe sets ``Recipe.top_logprobs``): other requests compute nothing extra.
    """

    dialect = "openai"

    @classmethod
    def option_problems(cls, o: dict[str, Any]) -> list[str]:
        """Every problem of the option values, before a model is loaded (``reef config`` asks)."""
        problems = []
        if o["max_batch_size"] < 1:
            problems.append("runtime.max_batch_size must be at least 1.")
        if o["max_context_tokens"] is not None and o["max_context_tokens"] < 2:
            problems.append("runtime.max_context_tokens must be at least 2 (a prompt token and an answer token), "
                            "or empty for the model's context.")
        if o["prefill_chunk_tokens"] < 1:
            problems.append("runtime.prefill_chunk_tokens must be at least 1.")
        if o["max_new_tokens_default"] < 1:
            problems.append("runtime.max_new_tokens_default must be at least 1.")
        if not o["batch_window_ms"] >= 0:
            problems.append("runtime.batch_window_ms must be 0 or more (milliseconds).")
        return problems

    def __init__(
        self,
        model: str | None = None,
        cache_dir: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        max_batch_size: int = 8,
        batch_window_ms: float = 8.0,
        max_new_tokens_default: int = 256,
        max_context_tokens: int | None = None,
        prefill_chunk_tokens: int = 512,
    ):
        refuse_bad_options(type(self), locals())
        self.model_option = model
        self.cache_dir = cache_dir
        self.device = device
        self.dtype = dtype
        self.max_batch_size = int(max_batch_size)
        self.batch_window_ms = float(batch_window_ms)
        self.max_new_tokens_default = int(max_new_tokens_default)
        self.max_context_tokens = int(max_context_tokens) if max_context_tokens is not None else None
        self.prefill_chunk_tokens = int(prefill_chunk_tokens)
        #: the most tokens of one conversation, once started (the model's context, or max_context_tokens)
        self.context_tokens: int | None = None
        self.adapters = AdapterTable()
        self.loaded = None  # reef_torch.model_loading.LoadedModel once started
        self.engine = None  # reef_torch.engine.GenerationEngine once started
        self._start_lock = asyncio.Lock()
        self._activate_lock = asyncio.Lock()
        #: renders and tokenizes prompts off the event loop (a long one takes seconds), one at a time
        self._render: ThreadPoolExecutor | None = None
        #: the longest token of the vocabulary, in characters: a prompt has at least its text's
        #: length over this many tokens, so a far too long one is refused before it is tokenized
        self._longest_token = 1

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        async with self._start_lock:
            if self.engine is not None:
                return
            try:
                loaded = await asyncio.to_thread(self._load)
            except ModelLoadError as exc:
                raise ModelNotLoadable(str(exc)) from exc
            from .engine import GenerationEngine

            self.loaded = loaded
            self.context_tokens = context_limit(loaded.model, self.max_context_tokens)
            self._longest_token = max(map(len, loaded.tokenizer.get_vocab()), default=1)
            self._render = ThreadPoolExecutor(1, thread_name_prefix="reef-local-render")
            self.engine = GenerationEngine(
                loaded.model,
                loaded.tokenizer,
                max_batch_size=self.max_batch_size,
                batch_window_ms=self.batch_window_ms,
                max_len=self.context_tokens,
                prefill_chunk_tokens=self.prefill_chunk_tokens,
            )

    def _load(self):
        from .model_loading import load_model, resolve_model_dir

        model_dir, model_id = resolve_model_dir(self.model_option, self.cache_dir)
        return load_model(model_dir, model_id, device=self.device, dtype=self.dtype)

    async def aclose(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            await asyncio.to_thread(engine.close)
        render, self._render = self._render, None
        if render is not None:
            render.shutdown(wait=False, cancel_futures=True)

    def models(self) -> list[str]:
        """The one model served: requests naming another one are refused by the kernel (404)."""
        return [self.model_id]

    @property
    def model_id(self) -> str:
        """The served model's name: ``SmolLM2-135M-Instruct`` for the embedded model, else the
        model directory's name; the same before and after ``start()``."""
        if self.loaded is not None:
            return self.loaded.model_id
        if self.model_option in EMBEDDED_ALIASES:
            return EMBEDDED_MODEL_ID
        return Path(str(self.model_option)).expanduser().name

    @property
    def tokenizer(self):
        self._require_started()
        return self.loaded.tokenizer

    # ------------------------------------------------------------------ reef_core.TrainableBase

    def trainable_problem(self) -> str | None:
        """None: the served model is always a local directory training can load."""
        return None

    def base_model(self) -> ServedBase:
        """The HF directory served (for the embedded model: its converted cache), its device,
        dtype and end-of-turn ids; what ``reef_train.load_trainable`` loads its own copy from."""
        self._require_started()
        loaded = self.loaded
        return ServedBase(
            path=Path(loaded.model_dir).resolve(),
            model_id=loaded.model_id,
            device=str(loaded.device),
            dtype=str(loaded.dtype).removeprefix("torch."),
            eos_token_ids=tuple(sorted(self.engine.eos_ids)),
        )

    def adapter_of(self, release: ActiveRelease | None) -> Path | None:
        """The release's ``adapter/`` (checked to be a PEFT directory), None for the base."""
        if release is None or release.adapter_dir is None:
            return None
        self._check_adapter_dir(release)
        return release.adapter_dir

    def _require_started(self) -> None:
        if self.engine is None:
            raise RuntimeUnavailable("The local runtime is not started; call `await runtime.start()` first.")

    # ------------------------------------------------------------------ adapters

    async def activate(self, release: ActiveRelease) -> None:
        await self.start()
        adapter_dir = release.adapter_dir
        name = version_name(release.scenario, release.release_id) if adapter_dir is not None else None
        self._check_adapter_dir(release)

        def swap() -> None:
            # Runs on the worker thread, between two forwards, like every drain-time unload:
            # loading, switching and unloading can never interleave with each other or a step.
            if name is not None and name not in getattr(self.engine.model, "peft_config", {}):
                self._load_adapter(name, adapter_dir)
            for old in self.adapters.activate(release.scenario, release.release_id, name):
                self._unload_adapter(old)

        async with self._activate_lock:
            await self._on_worker(swap, release)

    async def _on_worker(self, fn, release: ActiveRelease):
        """Run an adapter command on the engine's worker thread; a failure names the release."""
        return await self._on_worker_future(self.engine.call(fn), release)

    @staticmethod
    async def _on_worker_future(future, release: ActiveRelease):
        """The result of an adapter command queued on the worker (``engine.call``); a failure names the release."""
        try:
            return await asyncio.wrap_future(future)
        except Exception as exc:
            raise RuntimeCallError(
                f"Could not load the adapter of release {release.release_id} ({release.adapter_dir}): {exc}. "
                "Check that it was trained on this runtime's base model.",
                status=500,
            ) from exc

    def _load_adapter(self, name: str, path: Path) -> None:
        """Worker thread only: add adapter ``name`` to the serving model."""
        from peft import PeftConfig, PeftModel

        engine = self.engine
        model = engine.model
        try:
            if hasattr(model, "peft_config"):
                loaded = model.load_adapter(str(path), adapter_name=name, is_trainable=False)
            else:  # PeftModel.from_pretrained's two steps, to see what the load found
                config = PeftConfig.from_pretrained(str(path))
                config.inference_mode = True
                engine.model = PeftModel(model, config, adapter_name=name)
                loaded = engine.model.load_adapter(str(path), adapter_name=name, is_trainable=False)
            missing = list(getattr(loaded, "missing_keys", None) or ())
            if missing:
                # peft only warns: the adapter's layers would serve at their initial (zero) update,
                # answering as the base model under the release's name
                raise ValueError(f"{len(missing)} of the adapter's LoRA weights are not in its file "
                                 f"(for example {missing[0]}): its modules do not match this model's")
        except BaseException:
            # peft adds the adapter's layers before it reads the weights: a load that fails there
            # (weights of another base model, a missing file) leaves them behind, freshly
            # initialized, and a later load of the same name would be skipped as done.
            self._undo_failed_load(model, name)
            raise
        engine.model.eval()
        log.info("loaded adapter %s from %s", name, path)

    def _undo_failed_load(self, model, name: str) -> None:
        """Worker thread only: remove what a failed load of adapter ``name`` left in ``model``
        (the model as it was before the load), so that the engine serves as before it."""
        from peft import PeftModel
        from peft.tuners.tuners_utils import BaseTunerLayer

        engine = self.engine
        if isinstance(model, PeftModel):  # load_adapter failed: the other adapters stay
            if name in model.peft_config:
                self._unload_adapter(name)
            return
        engine.model = model  # PeftModel.from_pretrained failed: strip the layers it injected
        tuners = [key for key, module in model.named_modules() if isinstance(module, BaseTunerLayer)]
        for key in tuners:
            parent, _, child = key.rpartition(".")
            layer = model.get_submodule(key)
            setattr(model.get_submodule(parent) if parent else model, child, layer.get_base_layer())
        if "peft_config" in vars(model):
            del model.peft_config

    def _unload_adapter(self, name: str) -> None:
        """Worker thread only: delete adapter ``name`` (no request holds it any more)."""
        engine = self.engine
        if engine is None:  # closing (aclose): the requests leaving now take the model with them
            return
        model = engine.model
        if name in getattr(model, "peft_config", {}):
            with warnings.catch_warnings():
                # peft warns when the adapter it considers "active" is deleted; the engine picks
                # the adapter per forward, so that notion (and the warning) means nothing here.
                warnings.filterwarnings("ignore", message=r"Adapter .* was active which is now deleted")
                model.delete_adapter(name)
            log.info("unloaded adapter %s", name)
            if not model.peft_config:  # no adapter left: serve the plain model at full speed again
                engine.model = model.unload()
                engine.model.eval()

    def serving(self) -> dict[str, dict]:
        """Scenario → ``{release_id, adapter, holds}`` served now (for status pages and tests)."""
        return self.adapters.snapshot()

    # ------------------------------------------------------------------ inference

    async def complete(self, call: InferenceCall) -> dict[str, Any]:
        params, handle, queue = await self._submit(call)
        created = int(time.time())
        try:
            while True:
                kind, payload = await queue.get()
                if kind == "error":
                    raise _as_call_error(payload)
                if kind == "done":
                    break
        except BaseException:
            handle.cancel()
            raise
        result = payload
        self._fill_extras(call, handle, result)
        lp = token_logprobs(self.tokenizer, result.token_ids, result.logprobs) if params.logprobs else None
        return completion_body(
            completion_id=new_completion_id(),
            model=self.model_id,
            text=result.text,
            finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=len(result.token_ids),
            created=created,
            logprobs=lp,
        )

    def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        return self._stream(call)

    async def _stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        """The answer as chunks; with ``logprobs: true`` every token's logprob arrives with the
        last chunk (the text deltas are held back at stop-string and UTF-8 boundaries, so they
        do not map onto tokens one to one)."""
        params, handle, queue = await self._submit(call, stream=True)
        cid, created, model = new_completion_id(), int(time.time()), self.model_id
        try:
            yield chunk(completion_id=cid, model=model, created=created, delta={"role": "assistant", "content": ""})
            while True:
                kind, payload = await queue.get()
                if kind == "delta":
                    yield chunk(completion_id=cid, model=model, created=created, delta={"content": payload})
                elif kind == "error":
                    raise _as_call_error(payload)
                else:
                    result = payload
                    self._fill_extras(call, handle, result)
                    n = len(result.token_ids)
                    usage = {
                        "prompt_tokens": result.prompt_tokens,
                        "completion_tokens": n,
                        "total_tokens": result.prompt_tokens + n,
                    }
                    lp = token_logprobs(self.tokenizer, result.token_ids, result.logprobs) if params.logprobs else None
                    yield chunk(completion_id=cid, model=model, created=created, delta={},
                                finish_reason=result.finish_reason, usage=usage, logprobs=lp)
                    return
        finally:
            handle.cancel()  # no-op when finished; stops decoding when the client went away

    async def _submit(self, call: InferenceCall, stream: bool = False):
        from .engine import GenerationRequest

        await self.start()
        params = parse_chat_request(call.body)
        limit = self.context_tokens
        at_least = sum(len(m["content"]) for m in params.messages if isinstance(m.get("content"), str)) \
            // self._longest_token
        if at_least >= limit:  # surely too long: refused without the seconds its tokenizing would take
            raise prompt_too_long(at_least, limit, self.model_id, configured=limit == self.max_context_tokens)
        prompt_ids = await asyncio.get_running_loop().run_in_executor(self._render, self._prompt_ids, params)
        if len(prompt_ids) >= limit:
            raise prompt_too_long(len(prompt_ids), limit, self.model_id, configured=limit == self.max_context_tokens)
        max_new = min(params.max_tokens or self.max_new_tokens_default, limit - len(prompt_ids))
        version = await self._hold_version(call)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def sink(kind: str, payload: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, payload))
            except RuntimeError:  # the loop is gone: nobody is waiting any more
                pass

        req = GenerationRequest(
            prompt_ids=prompt_ids,
            max_new_tokens=max_new,
            sink=sink,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            stop=params.stop,
            seed=params.seed,
            adapter=version.adapter,
            stream=stream,
            on_leave=lambda: self._release(version),
            top_logprobs=max(int(call.top_logprobs or 0), 0),
        )
        try:
            self.engine.submit(req)
        except RuntimeError as exc:
            req.on_leave = None
            self._release(version)
            raise RuntimeUnavailable(f"The local runtime is shutting down ({exc}); retry shortly.") from exc
        call.extras["prompt_token_ids"] = prompt_ids
        call.extras["adapter"] = version.adapter
        return params, req, queue

    async def _hold_version(self, call: InferenceCall) -> Version:
        """The adapter version ``call`` runs on, held until the request leaves the batch.

        The release on the call (frozen by the server at request start, or a candidate under
        evaluation) wins: when it is not resident it is loaded for the requests that name it
        and unloaded after them, so the record and the weights always agree. Without one the
        scenario's active version serves.
        """
        version = self.adapters.hold_for_call(call.scenario, call.release)
        if version is not None:
            return version
        release = call.release
        adapter_dir = release.adapter_dir
        self._check_adapter_dir(release)
        name = version_name(release.scenario, release.release_id) if adapter_dir is not None else None

        def load() -> Version:
            held = self.adapters.acquire_exact(release.scenario, release.release_id)
            if held is not None:
                return held
            if name is not None and name not in getattr(self.engine.model, "peft_config", {}):
                self._load_adapter(name, adapter_dir)
            return self.adapters.hold_transient(release.scenario, release.release_id, name)

        loading = self.engine.call(load)
        try:
            return await self._on_worker_future(loading, release)
        except asyncio.CancelledError:
            # The caller left (a client gone, an evaluation cut) while the load ran, or after it
            # ended: the hold it took is given back once it has, or the version never drains.
            loading.add_done_callback(self._give_back_hold)
            raise

    def _give_back_hold(self, loading) -> None:
        """Done callback of a load whose caller left: release the version it held, on the worker."""
        if loading.cancelled() or loading.exception() is not None:
            return
        version, engine = loading.result(), self.engine
        if engine is not None:  # closing: the model goes, and its adapters with it
            engine.call(lambda: self._release(version))

    @staticmethod
    def _check_adapter_dir(release: ActiveRelease) -> None:
        if release.path is not None and not release.path.is_dir():
            # Without its directory the release would read as one without adapter/ and run on the
            # base model under its name: the chain prunes old materialized releases, so one a
            # request froze may be gone when its adapter, since unloaded, is needed again.
            raise RuntimeCallError(
                f"Release {release.release_id} of scenario {release.scenario!r} is no longer available here "
                "(its files were removed, as those of releases swapped out long ago are); retry the request.",
                status=503,
            )
        adapter_dir = release.adapter_dir
        if adapter_dir is not None and not (adapter_dir / "adapter_config.json").is_file():
            raise RuntimeCallError(
                f"Release {release.release_id} of scenario {release.scenario!r} has an adapter/ "
                "directory without adapter_config.json; publish a PEFT adapter saved with "
                "save_pretrained().",
                status=500,
            )

    def _release(self, version: Version) -> None:
        """Called from the worker thread when a request leaves the batch."""
        for name in self.adapters.release(version):
            self._unload_adapter(name)

    def _prompt_ids(self, params) -> list[int]:
        try:
            return chat_prompt_ids(self.tokenizer, params.messages, params.tools)
        except Exception as exc:
            raise invalid(f"The chat template could not render these messages: {exc}", "messages") from exc

    def _fill_extras(self, call: InferenceCall, handle, result) -> None:
        call.extras.update(
            {
                "response_token_ids": result.token_ids,
                "logprobs": result.logprobs,
                "logprobs_temperature": handle.temperature if handle.temperature > 0 else 1.0,
                "adapter": result.adapter,
                "finish_reason": result.finish_reason,
            }
        )
        if result.top_logprobs is not None:
            call.extras["top_logprobs"] = result.top_logprobs


def context_limit(model, configured: int | None) -> int:
    """The most tokens (prompt and completion) one conversation may hold: the model's context
    (``max_position_embeddings``, else 4096), or ``runtime.max_context_tokens`` when lower."""
    context = int(getattr(model.config, "max_position_embeddings", None) or 4096)
    return min(context, configured) if configured else context


def _as_call_error(exc: BaseException) -> RuntimeCallError:
    if isinstance(exc, RuntimeCallError):
        return exc
    message = f"The local model failed while generating: {exc}"
    return RuntimeCallError(
        message, status=500, body={"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    )
