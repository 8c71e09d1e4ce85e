"""The upstream runtime's server-sent-event splitter (``_sse_batches``): the same events
however the stream is cut into network reads, and linear in the stream's size, so an upstream
that sends one endless event in small reads cannot hold the event loop."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from reef_core.builtins.upstream import _data_of, _sse_batches
from reef_core.kit.http_transport import UpstreamResponse


def _response(chunks: list[bytes]) -> UpstreamResponse:
    async def gen():
        for chunk in chunks:
            await asyncio.sleep(0)  # as the network would: the loop runs between reads
            yield chunk

    async def nothing():
        return b""

    return UpstreamResponse(200, {}, nothing, gen, nothing)


async def _events(chunks: list[bytes]) -> list[bytes]:
    return [data async for batch in _sse_batches(_response(chunks)) for data in batch]


def _reference(stream: bytes) -> list[bytes]:
    """The whole stream at once: line ends normalized, split on blank lines."""
    blocks = stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n\n")
    return [data for data in map(_data_of, blocks) if data is not None]


lines = st.sampled_from([b"data: {\"a\":1}", b"data:x", b"data: ", b"event: e", b": comment", b"id: 3", b"data: [DONE]",
                         b"", b"data: two", b"junk"])
line_ends = st.sampled_from([b"\n", b"\r\n", b"\r"])


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(parts=st.lists(st.tuples(lines, line_ends), max_size=30), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_the_events_do_not_depend_on_where_the_reads_are_cut(parts, cuts):
    stream = b"".join(line + end for line, end in parts)
    bounds = sorted({0, len(stream), *[c for c in cuts if c < len(stream)]})
    chunks = [stream[a:b] for a, b in zip(bounds, bounds[1:])]
    assert asyncio.run(_events(chunks)) == _reference(stream)


async def test_one_endless_event_in_small_reads_is_split_in_linear_time():
    piece = b"x" * 1024
    chunks = [b"data: "] + [piece] * (32 << 10) + [b"\n\ndata: end\n\n"]  # a 32 MiB event, 1 KiB a read
    # A safety net, not a measurement: re-copying the growing event each read takes many minutes.
    events = await asyncio.wait_for(_events(chunks), 60)
    assert [len(e) for e in events] == [32 << 20, 3]
