"""The generation engine: one worker thread that owns the model and batches every request.

Why a thread: a forward pass on CPU takes tens of milliseconds and holds the GIL only
briefly inside torch, so running it on the asyncio loop would stall every other request
(and the server's health checks). The worker is the *only* code that touches the model, so
adapter loads and unloads are queued to it as commands and run between two decode steps:
a forward never sees a half-loaded adapter.

Batching is continuous: while a batch is decoding, newly arrived requests are prefilled
together and merged into the running batch at the next step boundary (their KV caches are
left-padded to a common length), and finished sequences leave the batch at once. When the
engine is idle, the first request waits ``batch_window_ms`` for company so a burst of
concurrent requests starts as one batch. Each decode step is one batched forward for all
running rows, whatever adapter each row uses (peft's ``adapter_names`` mixed-batch forward
when the rows' adapters differ).

Memory stays bounded: the running batch's keys and values live in one ``KVBuffer``
(``kv_cache.py``) that is written in place and reused from batch to batch, at most
``max_batch_size`` rows of ``max_len`` tokens, allocated as the batch needs them. A prefill
writes its newcomers' keys and values straight into the buffer, and runs in forwards of at most
``prefill_chunk_tokens`` tokens (padding included): short prompts that arrive together share
one forward, a long prompt goes alone, chunk after chunk, so a forward's activations (hidden
states, the MLP's intermediate, the attention mask) stay those of a short prompt whatever the
prompt's length. Every forward computes logits for the last position only (``logits_to_keep=1``):
over a whole 8k-token prompt they would be 8192 x 49152 floats, 1.6 GB for SmolLM2. When the
engine goes idle, freed heap pages go back to the OS (``malloc_trim``).
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from reef_train.sampling import make_generator, sample_rows, top_logprobs_rows

from .kv_cache import CacheLimitError, KVBuffer

log = logging.getLogger(__name__)


@dataclass
class GenerationRequest:
    """What one call asks the engine for; ``sink(kind, payload)`` receives its events.

    Events, emitted from the worker thread: ``("delta", text)`` (only when ``stream``),
    then exactly one of ``("done", GenerationResult)`` or ``("error", Exception)``.
    ``on_leave`` runs in the worker thread once the sequence has left the batch for good
    (finished, cancelled or failed); the runtime uses it to release its adapter hold.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    sink: Callable[[str, Any], None]
    temperature: float = 1.0
    top_p: float = 1.0
    #: keep only the K most likely tokens (0: off)
    top_k: int = 0
    #: drop tokens less likely than this fraction of the most likely one (0: off)
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    adapter: str | None = None
    stream: bool = False
    on_leave: Callable[[], None] | None = None
    cancelled: bool = False
    #: per response token, how many most likely tokens to report with their logprobs (0: none)
    top_logprobs: int = 0

    def cancel(self) -> None:
        """Ask the engine to drop this sequence at the next step (client went away)."""
        self.cancelled = True


class _Abandoned(Exception):
    """Every request of a prefill was cancelled before it ended."""


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    adapter: str | None
    #: per response token ``[[token_id, logprob], ...]`` when the request asked for top logprobs
    top_logprobs: list[list[list[float]]] | None = None


@dataclass
class _Row:
    req: GenerationRequest
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[list[float]]] = field(default_factory=list)
    emitted: int = 0  # characters of text already streamed

    @property
    def next_position(self) -> int:
        return len(self.req.prompt_ids) + len(self.tokens) - 1


class GenerationEngine:
    """Owns ``model`` on a worker thread; ``submit`` requests, ``call`` admin functions.

    ``max_len`` bounds the tokens (prompt plus completion) of one sequence and so the KV
    buffer's columns; by default the model's ``max_position_embeddings`` (else 4096).
    ``prefill_chunk_tokens`` bounds the tokens (padding included) of one prefill forward.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 8,
        batch_window_ms: float = 8.0,
        max_len: int | None = None,
        prefill_chunk_tokens: int = 512,
    ):
        self.model = model
        # A private copy for incremental detokenizing on the worker thread: the Rust
        # tokenizer behind a fast tokenizer must not be borrowed from two threads at once.
        self.tokenizer = copy.deepcopy(tokenizer)
        self.max_batch_size = max(1, int(max_batch_size))
        self.batch_window_s = max(0.0, float(batch_window_ms)) / 1000.0
        self.prefill_chunk_tokens = max(1, int(prefill_chunk_tokens))
        self.device = next(model.parameters()).device
        self.eos_ids = _eos_ids(model, tokenizer)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        # transformers 5.2x renamed the forward argument past_key_values to cache
        self._cache_kw = "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids))
        #: (kind, batch size) of every forward, newest last: "prefill" or "decode"
        self.forward_log: deque[tuple[str, int]] = deque(maxlen=100_000)
        self._cond = threading.Condition()
        self._pending: deque[GenerationRequest] = deque()
        self._commands: deque[tuple[Callable[[], Any], Future]] = deque()
        self._rows: list[_Row] = []
        if max_len is None:
            max_len = getattr(getattr(model, "config", None), "max_position_embeddings", None) or 4096
        #: keys and values of the running rows, reused from batch to batch
        self.kv = KVBuffer(self.max_batch_size, int(max_len), layers=_layer_count(model))
        self._mask: torch.Tensor | None = None
        self._trim_due = False  # the batch emptied since the heap was last trimmed
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="reef-torch-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public (any thread)

    def submit(self, req: GenerationRequest) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the generation engine is closed")
            self._pending.append(req)
            self._cond.notify()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn()`` on the worker between two decode steps; returns a Future of its result."""
        fut: Future = Future()
        with self._cond:
            if self._closed:
                fut.set_exception(RuntimeError("the generation engine is closed"))
                return fut
            self._commands.append((fn, fut))
            self._cond.notify()
        return fut

    def close(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    @property
    def running(self) -> int:
        return len(self._rows)

    # ------------------------------------------------------------------ worker thread

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                admitted = self._wait_for_work()
                if admitted is None:
                    break
                self._run_commands()
                try:
                    if admitted:
                        self._prefill(admitted)
                        self._run_commands()  # every forward boundary is a chance to swap
                    if self._rows:
                        self._decode_step()
                except Exception as exc:  # a failed forward fails its batch, not the engine
                    log.exception("generation step failed")
                    self._fail_all(exc)
                if self._trim_due and not (self._rows or self._pending or self._commands):
                    self._trim_due = False  # going idle: nobody waits for the trim
                    _trim_heap()
        self._shutdown()

    def _wait_for_work(self) -> list[GenerationRequest] | None:
        """Block until there is something to do; return requests to admit (None: closing)."""
        with self._cond:
            while not (self._closed or self._commands or self._pending or self._rows):
                self._cond.wait()
            if self._closed:
                return None
            if self._pending and not self._rows and self.batch_window_s > 0:
                deadline = time.monotonic() + self.batch_window_s
                while len(self._pending) < self.max_batch_size and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            admitted = []
            while self._pending and len(self._rows) + len(admitted) < self.max_batch_size:
                req = self._pending.popleft()
                if req.cancelled:
                    self._leave(req)
                else:
                    admitted.append(req)
            return admitted

    def _run_commands(self) -> None:
        while True:
            with self._cond:
                if not self._commands:
                    return
                fn, fut = self._commands.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future
                fut.set_exception(exc)

    def _forward(self, adapters: list[str | None], cache: Cache, **kwargs: Any) -> torch.Tensor:
        """One forward for rows whose adapters are ``adapters``; returns last-position logits.

        Base-model rows of a PeftModel go through peft's mixed-batch path as ``__base__``
        rather than ``disable_adapter()``, which depends on peft's notion of an active adapter.
        """
        model = self.model
        kwargs[self._cache_kw] = cache
        kwargs["use_cache"] = True
        kwargs["logits_to_keep"] = 1
        if not hasattr(model, "peft_config"):
            return model(**kwargs).logits[:, -1, :]
        distinct = set(adapters)
        if len(distinct) == 1 and None not in distinct:
            (name,) = distinct
            if model.active_adapter != name:
                model.set_adapter(name)
            return model(**kwargs).logits[:, -1, :]
        kwargs["adapter_names"] = [a if a is not None else "__base__" for a in adapters]
        return model(**kwargs).logits[:, -1, :]

    def _prefill(self, reqs: list[GenerationRequest]) -> None:
        """Prefill the newcomers into free rows of the KV buffer and sample their first tokens."""
        reqs = self._within_limit(reqs)
        if not reqs:
            return
        width = max(len(r.prompt_ids) for r in reqs)
        logits = []
        try:  # whatever a newcomer carries (an odd seed too) fails the newcomers, not the running batch
            rows = [_Row(req=r, generator=make_generator(r.seed)) for r in reqs]
            self.kv.open(len(reqs), width)
            first = 0
            for group in self._prefill_groups(reqs):
                logits.append(self._prefill_group(group, first, reqs))
                first += len(group)
        except _Abandoned:  # every newcomer's client went away: stop prefilling for nobody
            self.kv.abort()
            for req in reqs:
                self._leave(req)
            return
        except Exception as exc:  # fail only the newcomers; the running batch is intact
            log.exception("prefill failed")
            self.kv.abort()
            for req in reqs:
                self._finish_error(req, exc)
            return
        self.kv.commit()
        self._merge(rows, _left_aligned_mask([len(r.prompt_ids) for r in reqs], width, self.device))
        self._after_sampling(rows, torch.cat(logits))

    def _prefill_groups(self, reqs: list[GenerationRequest]) -> list[list[GenerationRequest]]:
        """Consecutive newcomers that share a forward: as many as fit ``prefill_chunk_tokens``
        once left-padded to the group's longest prompt; a longer prompt is a group of its own."""
        groups: list[list[GenerationRequest]] = []
        budget = self.prefill_chunk_tokens
        for req in reqs:
            group = groups[-1] if groups else None
            if group and (len(group) + 1) * max(len(req.prompt_ids), *(len(r.prompt_ids) for r in group)) <= budget:
                group.append(req)
            else:
                groups.append([req])
        return groups

    def _prefill_group(self, reqs: list[GenerationRequest], first: int,
                       newcomers: list[GenerationRequest] | None = None) -> torch.Tensor:
        """Run the prefill of newcomers ``first ..`` in forwards of at most ``prefill_chunk_tokens``
        tokens, straight into their KV rows; returns their last positions' logits. Raises
        ``_Abandoned`` between two forwards once every one of ``newcomers`` is cancelled (a long
        prompt's prefill runs for seconds: nobody should wait behind one its client left)."""
        newcomers = newcomers or reqs
        lengths = [len(r.prompt_ids) for r in reqs]
        width = max(lengths)
        ids = torch.full((len(reqs), width), self.pad_id, dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, width - lengths[i] :] = torch.tensor(r.prompt_ids, dtype=torch.long)
        mask = _left_aligned_mask(lengths, width, torch.device("cpu"))
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, positions = ids.to(self.device), mask.to(self.device), positions.to(self.device)
        view = self.kv.prefill_view(first, len(reqs), width)
        step = max(1, self.prefill_chunk_tokens // len(reqs))
        adapters = [r.adapter for r in reqs]
        logits = None
        for begin in range(0, width, step):
            if begin and all(r.cancelled for r in newcomers):
                raise _Abandoned
            stop = min(width, begin + step)
            logits = self._forward(
                adapters,
                input_ids=ids[:, begin:stop],
                attention_mask=mask[:, :stop],
                position_ids=positions[:, begin:stop],
                cache=view.cache,
            )
            view.advance(stop - begin)
            self.forward_log.append(("prefill", len(reqs)))
        return logits

    def _within_limit(self, reqs: list[GenerationRequest]) -> list[GenerationRequest]:
        """Fail the requests that could outgrow ``max_len``; return the others."""
        limit = self.kv.max_len
        ok = []
        for req in reqs:
            total = len(req.prompt_ids) + req.max_new_tokens
            if total > limit:
                err = CacheLimitError(
                    f"The prompt ({len(req.prompt_ids)} tokens) plus max_tokens ({req.max_new_tokens}) exceed "
                    f"this engine's {limit}-token limit; shorten the prompt or lower max_tokens."
                )
                self._leave(req)
                req.sink("error", err)
            else:
                ok.append(req)
        return ok

    def _decode_step(self) -> None:
        rows = self._rows
        ids = torch.tensor([[r.tokens[-1]] for r in rows], dtype=torch.long, device=self.device)
        positions = torch.tensor([[r.next_position] for r in rows], dtype=torch.long, device=self.device)
        self._mask = torch.cat([self._mask, torch.ones((len(rows), 1), dtype=torch.long, device=self.device)], 1)
        self.kv.reserve(1)
        logits = self._forward(
            [r.req.adapter for r in rows],
            input_ids=ids,
            attention_mask=self._mask,
            position_ids=positions,
            cache=self.kv.cache,
        )
        self.kv.advance(1)
        self.forward_log.append(("decode", len(rows)))
        self._after_sampling(rows, logits)

    def _after_sampling(self, rows: list[_Row], logits: torch.Tensor) -> None:
        """Sample one token for each of ``rows`` (the last rows of the batch) and retire finished ones."""
        tokens, logprobs = sample_rows(
            logits,
            [r.req.temperature for r in rows],
            [r.req.top_p for r in rows],
            [r.generator for r in rows],
            [r.req.top_k for r in rows],
            [r.req.min_p for r in rows],
        )
        ks = [r.req.top_logprobs for r in rows]
        tops = top_logprobs_rows(logits, [r.req.temperature for r in rows], ks) if any(ks) else None
        finished: set[int] = set()
        for i, (row, tok, lp) in enumerate(zip(rows, tokens, logprobs)):
            row.tokens.append(tok)
            row.logprobs.append(lp)
            if tops is not None and tops[i] is not None:
                row.top.append(tops[i])
            if row.req.cancelled:
                self._leave(row.req)
                finished.add(id(row))
            elif self._advance(row, tok):
                finished.add(id(row))
        for row in list(self._rows):
            if row.req.cancelled and id(row) not in finished:
                self._leave(row.req)
                finished.add(id(row))
        if finished:
            self._drop({i for i, r in enumerate(self._rows) if id(r) in finished})

    def _advance(self, row: _Row, tok: int) -> bool:
        """Emit what the new token makes final; return True when the sequence is done."""
        req = row.req
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        finish = None
        cut = len(text)
        if req.stop:
            hits = [i for i in (text.find(s) for s in req.stop) if i >= 0]
            if hits:
                cut, finish = min(hits), "stop"
        if finish is None and tok in self.eos_ids:
            finish = "stop"
        if finish is None and len(row.tokens) >= req.max_new_tokens:
            finish = "length"
        if finish is not None:
            # an answer that ends inside a character (max_tokens between two tokens of one emoji)
            # ends before it, as vLLM's does: a stream never shows a half character mid-answer either
            text = text[:cut] if cut < len(text) else _complete_prefix(text)
            if req.stream and len(text) > row.emitted:
                req.sink("delta", text[row.emitted :])
            result = GenerationResult(
                text=text,
                token_ids=list(row.tokens),
                logprobs=list(row.logprobs),
                finish_reason=finish,
                prompt_tokens=len(req.prompt_ids),
                adapter=req.adapter,
                top_logprobs=list(row.top) if req.top_logprobs > 0 else None,
            )
            self._leave(req)
            req.sink("done", result)
            return True
        if req.stream:
            safe = _safe_prefix_len(text, req.stop)
            if safe > row.emitted:
                req.sink("delta", text[row.emitted : safe])
                row.emitted = safe
        return False

    # ------------------------------------------------------------------ batch bookkeeping

    def _merge(self, rows: list[_Row], mask: torch.Tensor) -> None:
        """Append freshly prefilled ``rows`` (already in the KV buffer) to the running batch,
        left-padding the shorter side's attention mask."""
        if not self._rows:
            self._rows, self._mask = rows, mask
            return
        width = max(self._mask.shape[1], mask.shape[1])
        self._mask = torch.cat([_lpad(self._mask, width, dim=1), _lpad(mask, width, dim=1)], 0)
        self._rows = self._rows + rows

    def _drop(self, indices: set[int]) -> None:
        keep = [i for i in range(len(self._rows)) if i not in indices]
        if not keep:
            self._clear_batch()
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self._rows = [self._rows[i] for i in keep]
        mask = self._mask[index]
        # columns that are padding for every remaining row carry nothing: cut them off
        start = int((mask.sum(0) > 0).nonzero()[0].item())
        self.kv.keep(keep, start)
        self._mask = mask[:, start:]

    def _clear_batch(self) -> None:
        """The batch is empty (finished or failed): reset the KV buffer; trim the heap once idle."""
        self._rows, self._mask = [], None
        self.kv.clear()
        self._trim_due = True

    def _leave(self, req: GenerationRequest) -> None:
        if req.on_leave is not None:
            callback, req.on_leave = req.on_leave, None
            try:
                callback()
            except Exception:
                log.exception("on_leave callback failed")

    def _finish_error(self, req: GenerationRequest, exc: BaseException) -> None:
        self._leave(req)
        req.sink("error", exc)

    def _fail_all(self, exc: BaseException) -> None:
        for row in self._rows:
            self._finish_error(row.req, exc)
        self._clear_batch()

    def _shutdown(self) -> None:
        err = RuntimeError("the local runtime is shutting down; retry on another server")
        for row in self._rows:
            self._finish_error(row.req, err)
        self._clear_batch()
        with self._cond:
            pending, self._pending = list(self._pending), deque()
            commands, self._commands = list(self._commands), deque()
        for req in pending:
            self._leave(req)
            req.sink("error", err)
        for _, fut in commands:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(err)


def _left_aligned_mask(lengths: list[int], width: int, device: torch.device) -> torch.Tensor:
    """Attention mask of prompts of ``lengths`` left-padded to ``width``: 1 on each one's tokens."""
    lengths_t = torch.tensor(lengths, dtype=torch.long).unsqueeze(1)
    mask = (torch.arange(width).unsqueeze(0) >= width - lengths_t).to(torch.long)
    return mask.to(device)


def _layer_count(model: Any) -> int | None:
    """How many layers hold keys and values: what a ``DynamicCache`` for the model's config
    prepares, else ``num_hidden_layers``."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    try:
        layers = len(DynamicCache(config=config).layers)
    except Exception:  # a config the cache cannot read: fall back to the plain count
        layers = 0
    return layers or getattr(config, "num_hidden_layers", None)


def _lpad(t: torch.Tensor, width: int, dim: int = -2) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim)


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None on another C library."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_malloc_trim = _load_malloc_trim()


def _trim_heap() -> None:
    """Return the free pages of the malloc heap to the OS.

    CPU tensors come from malloc: after a batch, its activations and prefill caches are freed
    but glibc keeps the pages mapped (fragmented between live blocks, or simply cached), so
    resident memory only ratchets up. A trim costs about a millisecond (about 200 ms after a
    large release); the engine runs it only when it goes idle with nothing queued.
    """
    if _malloc_trim is not None:
        _malloc_trim(0)


def _complete_prefix(text: str) -> str:
    """``text`` without a trailing partial UTF-8 character (decoded as U+FFFD)."""
    return text.rstrip("\ufffd")


def _safe_prefix_len(text: str, stops: list[str]) -> int:
    """How much of ``text`` can be streamed: not a trailing partial UTF-8 character, nor a
    suffix that might still grow into a stop string."""
    end = len(_complete_prefix(text))
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, end), 0, -1):
            if text[end - k : end] == stop[:k]:
                hold = max(hold, k)
                break
    return end - hold


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    for value in (eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids
