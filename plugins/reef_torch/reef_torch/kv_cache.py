"""The engine's key/value cache: one buffer per layer, sized on demand, reused, bounded.

Why not a ``DynamicCache`` per batch: it grows by ``torch.cat`` at every decode step, so each
step allocates a fresh copy of the whole cache for every layer, and merging or dropping rows
builds yet another one. On CPU those short-lived multi-megabyte blocks fragment the malloc
heap, and the process's resident memory creeps up with the traffic. Here each layer owns one
``[max_rows, kv_heads, capacity, head_dim]`` tensor that lives as long as the engine: a decode
step writes one column in place, newcomers are copied into free rows, finished rows are
compacted away. Capacity grows (in ``chunk`` columns, at least doubling) only when the
batch's width needs it, never past ``max_len``, and a buffer grown past ``keep_len`` is
released when the batch empties so one long conversation does not pin its memory for good.

Layout: the running rows occupy slots ``[0, rows)``; every row is right-aligned on the write
head ``end`` and the batch's live window is columns ``[start, end)`` (left padding is masked
out by the engine's attention mask, exactly as with the left-padded ``DynamicCache``).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class CacheLimitError(ValueError):
    """A batch would need more cache columns than the engine's ``max_len``."""


class _WindowLayer(CacheLayerMixin):
    """One layer of the model's view of a :class:`KVBuffer`: writes go to the write head,
    reads see the live window. Holds no tensors of its own."""

    is_sliding = False
    is_compileable = False

    def __init__(self, buffer: KVBuffer, index: int):
        super().__init__()
        self._buffer = buffer
        self._index = index
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the buffer allocates when rows are admitted."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        return self._buffer.write(self._index, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._buffer.width + query_length, 0

    def get_seq_length(self) -> int:
        return self._buffer.width

    def get_max_length(self) -> int:
        return self._buffer.max_len


class KVBuffer:
    """Per-layer key/value tensors for up to ``max_rows`` sequences of up to ``max_len`` tokens.

    Only the engine's worker thread touches it. ``cache`` is the ``transformers`` cache object
    to pass to decode forwards; call :meth:`reserve` before and :meth:`advance` after each one.
    """

    def __init__(self, max_rows: int, max_len: int, *, chunk: int = 256, keep_len: int = 2048):
        if max_rows < 1 or max_len < 1:
            raise ValueError("a KV buffer needs max_rows >= 1 and max_len >= 1")
        self.max_rows = int(max_rows)
        self.max_len = int(max_len)
        self.chunk = max(1, int(chunk))
        self.keep_len = max(self.chunk, int(keep_len))
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.rows = 0
        self.start = 0
        self.end = 0
        self.cache: Cache | None = None
        #: how many times the buffers were (re)allocated: stays put while capacity suffices
        self.allocations = 0

    # ------------------------------------------------------------------ sizes

    @property
    def width(self) -> int:
        """Columns of the live window: the longest running row."""
        return self.end - self.start

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    # ------------------------------------------------------------------ forward protocol

    def write(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this forward's new columns of ``layer`` at the write head; return the window."""
        n, stop = self.rows, self.end + key_states.shape[-2]
        if key_states.shape[0] != n or stop > self.capacity:
            raise RuntimeError(f"KV buffer misuse: {key_states.shape[0]} rows / {stop} columns for {n} / {self.capacity}")
        keys, values = self.keys[layer], self.values[layer]
        keys[:n, :, self.end : stop].copy_(key_states)
        values[:n, :, self.end : stop].copy_(value_states)
        return keys[:n, :, self.start : stop], values[:n, :, self.start : stop]

    def reserve(self, columns: int) -> None:
        """Make room for ``columns`` more columns at the write head (compact, else grow)."""
        if self.end + columns <= self.capacity:
            return
        needed = self.width + columns
        self._relayout(self.capacity if needed <= self.capacity else self._grown(needed), 0)

    def advance(self, columns: int) -> None:
        """The forward that just ran wrote ``columns`` columns for every layer."""
        self.end += columns

    # ------------------------------------------------------------------ batch bookkeeping

    def admit(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Append freshly prefilled rows (per layer ``(keys, values)``, left-padded to one width)."""
        k_rows, new_width = layers[0][0].shape[0], layers[0][0].shape[2]
        if self.rows + k_rows > self.max_rows:
            raise RuntimeError(f"KV buffer misuse: {self.rows} + {k_rows} rows exceed {self.max_rows}")
        if not self.keys:
            self._allocate(layers, self._grown(new_width + 1))
        if self.rows == 0:
            self.start = self.end = 0
        old_width = self.width
        width = max(old_width, new_width)
        if self.end < width or self.end + 1 > self.capacity:
            # not enough columns left of the head for the wider batch, or none right of it
            capacity = self.capacity if width + 1 <= self.capacity else self._grown(width + 1)
            self._relayout(capacity, width - old_width)
        n, end, start = self.rows, self.end, self.end - width
        for (new_k, new_v), keys, values in zip(layers, self.keys, self.values):
            for new, buf in ((new_k, keys), (new_v, values)):
                if start < self.start:  # the old rows' new left padding
                    buf[:n, :, start : self.start].zero_()
                buf[n : n + k_rows, :, start : end - new_width].zero_()
                buf[n : n + k_rows, :, end - new_width : end].copy_(new)
        self.start = start
        self.rows = n + k_rows

    def keep(self, index: list[int], cut: int = 0) -> None:
        """Keep the rows at ``index`` (in that order) and drop the first ``cut`` columns."""
        m = len(index)
        if m == 0:
            self.clear()
            return
        if index != list(range(m)):
            where = torch.tensor(index, dtype=torch.long, device=self.keys[0].device)
            for buf in self.keys + self.values:
                window = buf[:, :, self.start : self.end]
                window[:m] = window.index_select(0, where)
        self.rows = m
        self.start += cut

    def clear(self) -> None:
        """No rows left: keep the buffers for the next batch unless they grew past ``keep_len``."""
        self.rows = self.start = self.end = 0
        if self.capacity > self.keep_len:
            self.keys, self.values, self.cache = [], [], None

    # ------------------------------------------------------------------ storage

    def _grown(self, needed: int) -> int:
        if needed > self.max_len:
            raise CacheLimitError(f"the batch needs {needed} cache positions; this engine holds at most {self.max_len}")
        size = max(needed, 2 * self.capacity, self.chunk)
        size = -(-size // self.chunk) * self.chunk
        return max(needed, min(size, self.max_len))

    def _allocate(self, layers: list[tuple[torch.Tensor, torch.Tensor]], capacity: int) -> None:
        def empty(like: torch.Tensor) -> torch.Tensor:
            _, heads, _, dim = like.shape
            return torch.zeros((self.max_rows, heads, capacity, dim), dtype=like.dtype, device=like.device)

        self.keys = [empty(k) for k, _ in layers]
        self.values = [empty(v) for _, v in layers]
        self.cache = Cache(layers=[_WindowLayer(self, i) for i in range(len(layers))])
        self.allocations += 1

    def _relayout(self, capacity: int, new_start: int) -> None:
        """Move the live window to ``[new_start, new_start + width)`` of buffers of ``capacity`` columns."""
        n, width = self.rows, self.width
        grow = capacity != self.capacity
        for bufs in (self.keys, self.values):
            for i, buf in enumerate(bufs):
                live = buf[:n, :, self.start : self.end]
                if grow:
                    new = buf.new_zeros((buf.shape[0], buf.shape[1], capacity, buf.shape[3]))
                    new[:n, :, new_start : new_start + width].copy_(live)
                    bufs[i] = new
                elif new_start != self.start:
                    buf[:n, :, new_start : new_start + width].copy_(live.clone())
        if grow:
            self.allocations += 1
        self.start, self.end = new_start, new_start + width
