"""The engine's key/value cache: one buffer per layer, sized on demand, reused, bounded.

Why not a ``DynamicCache`` per batch: it grows by ``torch.cat`` at every decode step, so each
step allocates a fresh copy of the whole cache for every layer, and merging or dropping rows
builds yet another one. On CPU those short-lived multi-megabyte blocks fragment the malloc
heap, and the process's resident memory creeps up with the traffic. Here each layer owns one
``[row_capacity, kv_heads, capacity, head_dim]`` tensor that lives as long as the engine: a
decode step writes one column in place, a prefill writes its newcomers' prompts straight into
free rows (no second copy of a long prompt's cache), finished rows are compacted away.

Both dimensions grow only when the batch needs them: rows up to ``max_rows`` (at least doubling),
columns in ``chunk`` steps (at least doubling) up to ``max_len``. Nothing is sized to the model's
full context or the engine's batch size up front: one 8k-token conversation of SmolLM2-135M holds
one row of 8k columns (30 layers x 2 x 3 heads x 64 x 4 bytes = 46 KB a token, 377 MB), not
``max_batch_size`` of them. A buffer grown past ``keep_len`` columns is released when the batch
empties, so one long conversation does not pin its memory for good.

Layout: the running rows occupy slots ``[0, rows)``; every row is right-aligned on the write head
``end`` and the batch's live window is columns ``[start, end)`` (left padding is masked out by the
engine's attention mask, exactly as with the left-padded ``DynamicCache``). Newcomers join in
three steps: :meth:`KVBuffer.open` makes room for them (zeroed, right-aligned on ``end``),
:meth:`KVBuffer.prefill_view` gives the cache object a prefill forward (or several, chunk by chunk)
writes through, and :meth:`KVBuffer.commit` makes them running rows (:meth:`KVBuffer.abort` drops
them instead).
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass
class _Newcomers:
    """Rows ``[row, row + rows)`` being prefilled into columns ``[column, column + written)``."""

    row: int
    rows: int
    column: int
    written: int = 0


class _PrefillLayer(CacheLayerMixin):
    """One layer of a prefill's view of a :class:`KVBuffer`: the newcomers' keys and values go
    straight into their rows; reads see what the newcomers wrote so far (their own past)."""

    is_sliding = False
    is_compileable = False

    def __init__(self, buffer: KVBuffer, index: int, group: _Newcomers):
        super().__init__()
        self._buffer = buffer
        self._index = index
        self._group = group
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the buffer allocates a layer at its first write."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        return self._buffer._write_newcomers(self._index, self._group, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._group.written + query_length, 0

    def get_seq_length(self) -> int:
        return self._group.written

    def get_max_length(self) -> int:
        return self._buffer.max_len


class PrefillView:
    """What a prefill passes as its cache: ``cache`` for the forward, ``advance(n)`` after it."""

    def __init__(self, buffer: KVBuffer, group: _Newcomers, layers: int):
        self._group = group
        self.cache = Cache(layers=[_PrefillLayer(buffer, i, group) for i in range(layers)])

    @property
    def written(self) -> int:
        return self._group.written

    def advance(self, columns: int) -> None:
        """The forward that just ran wrote ``columns`` more columns of the newcomers' prompts."""
        self._group.written += columns


class KVBuffer:
    """Per-layer key/value tensors for up to ``max_rows`` sequences of up to ``max_len`` tokens.

    Only the engine's worker thread touches it. ``cache`` is the ``transformers`` cache object
    to pass to decode forwards; call :meth:`reserve` before and :meth:`advance` after each one.
    ``layers`` is how many layers the model has; without it the first prefill finds out (each
    layer is allocated at its first write, so the buffer never needs the model's shapes).
    """

    def __init__(self, max_rows: int, max_len: int, *, chunk: int = 256, keep_len: int = 2048,
                 layers: int | None = None):
        if max_rows < 1 or max_len < 1:
            raise ValueError("a KV buffer needs max_rows >= 1 and max_len >= 1")
        self.max_rows = int(max_rows)
        self.max_len = int(max_len)
        self.chunk = max(1, int(chunk))
        self.keep_len = max(self.chunk, int(keep_len))
        self.layers = layers
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.rows = 0
        self.start = 0
        self.end = 0
        self.cache: Cache | None = None
        #: how many times the buffers were (re)allocated: stays put while capacity suffices
        self.allocations = 0
        self._shape: tuple[int, int] = (0, 0)  # (row capacity, column capacity) of every layer
        self._opened: tuple[int, int] | None = None  # (newcomer rows, new window width) between open and commit

    # ------------------------------------------------------------------ sizes

    @property
    def width(self) -> int:
        """Columns of the live window: the longest running row."""
        return self.end - self.start

    @property
    def capacity(self) -> int:
        """Columns allocated (0: nothing allocated)."""
        return self._shape[1]

    @property
    def row_capacity(self) -> int:
        """Rows allocated (0: nothing allocated); grows with the batch, up to ``max_rows``."""
        return self._shape[0]

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
        self._relayout(self.row_capacity, self.capacity if needed <= self.capacity else self._grown(needed), 0)

    def advance(self, columns: int) -> None:
        """The forward that just ran wrote ``columns`` columns for every layer."""
        self.end += columns

    # ------------------------------------------------------------------ newcomers

    def open(self, rows: int, width: int) -> None:
        """Make room for ``rows`` newcomers of at most ``width`` columns each, right-aligned on the
        write head (with a free column after it for the first decode step), zeroed; the running
        rows' new left padding, if the newcomers are wider, is zeroed too."""
        if self._opened is not None:
            raise RuntimeError("KV buffer misuse: open() twice without commit() or abort()")
        if self.rows + rows > self.max_rows:
            raise RuntimeError(f"KV buffer misuse: {self.rows} + {rows} rows exceed {self.max_rows}")
        if self.rows == 0:
            self.start = self.end = 0
        old_width = self.width
        new_width = max(old_width, width)
        needed_rows = self.rows + rows
        row_capacity = self.row_capacity
        if needed_rows > row_capacity:
            row_capacity = min(self.max_rows, max(needed_rows, 2 * row_capacity))
        capacity = self.capacity if new_width + 1 <= self.capacity else self._grown(new_width + 1)
        if not self.keys:  # nothing allocated: each layer is, at its first write
            self._shape = (row_capacity, capacity)
            self.start = self.end = new_width
        elif (row_capacity, capacity) != self._shape or self.end < new_width or self.end + 1 > capacity:
            self._relayout(row_capacity, capacity, new_width - old_width)
        n, end, start = self.rows, self.end, self.end - new_width
        for buf in self.keys + self.values:
            if start < self.start:  # the running rows' new left padding
                buf[:n, :, start : self.start].zero_()
            buf[n : n + rows, :, start:end].zero_()
        self._opened = (rows, new_width)

    def prefill_view(self, first: int, rows: int, width: int) -> PrefillView:
        """The cache for prefilling newcomers ``first .. first + rows - 1`` (counted from the first
        newcomer) whose prompts, left-padded to ``width``, end at the write head."""
        if self._opened is None or first + rows > self._opened[0] or width > self._opened[1]:
            raise RuntimeError(f"KV buffer misuse: prefill of newcomers {first}+{rows} x {width} not opened")
        if self.layers is None:
            raise RuntimeError("KV buffer misuse: the number of layers is unknown (give layers=)")
        return PrefillView(self, _Newcomers(row=self.rows + first, rows=rows, column=self.end - width), self.layers)

    def commit(self) -> None:
        """The opened newcomers are prefilled: they join the running rows."""
        rows, width = self._opened
        if len(self.keys) != self.layers:
            raise RuntimeError(f"KV buffer misuse: {len(self.keys)} of {self.layers} layers written by the prefill")
        self._opened = None
        self.rows += rows
        self.start = self.end - width
        if self.cache is None:
            self.cache = Cache(layers=[_WindowLayer(self, i) for i in range(self.layers)])

    def abort(self) -> None:
        """The opened newcomers' prefill failed: forget them (the running rows are untouched)."""
        self._opened = None
        if self.rows == 0:
            self.clear()
        elif len(self.keys) != self.layers:  # cannot happen with rows running; never keep half a buffer
            raise RuntimeError("KV buffer misuse: layers missing while rows are running")

    def admit(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Append rows prefilled elsewhere (per layer ``(keys, values)``, left-padded to one width)."""
        rows, width = layers[0][0].shape[0], layers[0][0].shape[2]
        if self.layers is None:
            self.layers = len(layers)
        self.open(rows, width)
        view = self.prefill_view(0, rows, width)
        for i, (keys, values) in enumerate(layers):
            self._write_newcomers(i, view._group, keys, values)
        self.commit()

    def _write_newcomers(self, layer: int, group: _Newcomers, key_states: torch.Tensor,
                         value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer >= len(self.keys):
            self._allocate_layer(layer, key_states)
        rows, stop = slice(group.row, group.row + group.rows), group.column + group.written + key_states.shape[-2]
        if key_states.shape[0] != group.rows or stop > self.end:
            raise RuntimeError(f"KV buffer misuse: {key_states.shape[0]} newcomer rows up to column {stop} "
                               f"for {group.rows} up to {self.end}")
        keys, values = self.keys[layer], self.values[layer]
        keys[rows, :, group.column + group.written : stop].copy_(key_states)
        values[rows, :, group.column + group.written : stop].copy_(value_states)
        return keys[rows, :, group.column : stop], values[rows, :, group.column : stop]

    # ------------------------------------------------------------------ batch bookkeeping

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
        """No rows left: keep the buffers for the next batch unless they grew past ``keep_len``.
        ``rows`` drops to 0 last: a caller on another thread that waits for no rows then sees the
        buffer already released."""
        self._opened = None
        if self.capacity > self.keep_len or (self.keys and len(self.keys) != self.layers):
            self.keys, self.values, self.cache = [], [], None
            self._shape = (0, 0)
        self.start = self.end = 0
        self.rows = 0

    # ------------------------------------------------------------------ storage

    def _grown(self, needed: int) -> int:
        if needed > self.max_len:
            raise CacheLimitError(f"the batch needs {needed} cache positions; this engine holds at most {self.max_len}")
        size = max(needed, 2 * self.capacity, self.chunk)
        size = -(-size // self.chunk) * self.chunk
        return max(needed, min(size, self.max_len))

    def _allocate_layer(self, layer: int, like: torch.Tensor) -> None:
        """Allocate ``layer`` (the next one: layers are written in order) shaped after ``like``."""
        if layer != len(self.keys):
            raise RuntimeError(f"KV buffer misuse: layer {layer} written before layer {len(self.keys)}")
        rows, capacity = self._shape
        _, heads, _, dim = like.shape
        for bufs in (self.keys, self.values):
            bufs.append(torch.zeros((rows, heads, capacity, dim), dtype=like.dtype, device=like.device))
        if layer == 0:
            self.allocations += 1

    def _relayout(self, row_capacity: int, capacity: int, new_start: int) -> None:
        """Move the live window to ``[new_start, new_start + width)`` of buffers of ``row_capacity``
        rows and ``capacity`` columns."""
        n, width = self.rows, self.width
        grow = (row_capacity, capacity) != self._shape
        for bufs in (self.keys, self.values):
            for i, buf in enumerate(bufs):
                live = buf[:n, :, self.start : self.end]
                if grow:
                    new = buf.new_zeros((row_capacity, buf.shape[1], capacity, buf.shape[3]))
                    new[:n, :, new_start : new_start + width].copy_(live)
                    bufs[i] = new
                    del buf, live  # let the old layer go before the next one is allocated
                elif new_start != self.start:
                    buf[:n, :, new_start : new_start + width].copy_(live.clone())
        if grow:
            self.allocations += 1
            self._shape = (row_capacity, capacity)
        self.start, self.end = new_start, new_start + width
