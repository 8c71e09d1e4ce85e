"""Reef's HTTP/1.1 upstream client against hostile upstreams: bytes sent out of turn never
become another request's answer, answers and their heads are bounded, a POST that may have
run is never sent twice, only plain ``chunked`` framing is accepted, and a stream nobody reads
gives its connection back."""

from __future__ import annotations

import asyncio
import gzip
import socket
import string
import time
import tracemalloc
import zlib

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scripted import Scripted, ThreadedScript, answer, gzip_bomb

from reef_core.builtins.upstream import UpstreamRuntime
from reef_core.errors import RuntimeUnavailable
from reef_core.kit.http1 import MAX_HEADER_BYTES, MAX_HEADERS, Http1Transport
from reef_core.kit.http_body import BodyReader, ResponseTooLarge
from reef_core.types import InferenceCall

HEADERS = [("content-type", "application/json")]
TIMEOUT = {"connect": 5, "read": 5, "pool": 5}
#: a status line and an unfinished header block: it fires no parser callback, and the next
#: answer's bytes complete it (its status line becomes this header's value)
SMUGGLED = b"HTTP/1.1 429 Too Many Requests\r\nx-smuggled: "


def _settings(max_examples: int):
    return settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
async def client():
    transport = Http1Transport()
    yield transport
    await transport.aclose()


# ------------------------------------------------------------------ answers out of turn


async def test_bytes_after_an_answer_in_the_same_read_never_answer_the_next_request(client):
    async def smuggling(reader, writer, n):
        writer.write(answer(b'{"n":%d}' % len(server.requests)) + (SMUGGLED if len(server.requests) == 1 else b""))

    async with Scripted(smuggling) as server:
        for i in (1, 2, 3):
            got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
            assert (got.status, await got.read()) == (200, b'{"n":%d}' % i)
        assert server.connections == 2  # the first connection was retired with its answer


@pytest.mark.parametrize("unread", [False, True], ids=["seen-by-the-loop", "still-unread"])
async def test_bytes_arriving_on_an_idle_connection_retire_it(unread, client):
    def smuggling(sock, n):
        sock.sendall(answer(b'{"n":%d}' % n))
        if n == 1:
            time.sleep(0.05)
            sock.sendall(SMUGGLED)

    with ThreadedScript(smuggling) as server:
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        assert await got.read() == b'{"n":1}'
        if unread:
            time.sleep(0.3)  # the loop is blocked: the bytes wait in the socket as the pool picks it
        else:
            await asyncio.sleep(0.3)
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        assert (got.status, await got.read()) == (200, b'{"n":2}')
        assert server.received == [1, 1]  # nothing more was sent on the first connection


trailing_bytes = st.one_of(
    st.binary(min_size=1, max_size=40),
    st.builds(lambda status, rest: b"HTTP/1.1 %d X\r\n" % status + rest, st.integers(100, 599),
              st.binary(max_size=40)),
    st.sampled_from([SMUGGLED, b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nevil!", b"\r\n", b"H"]),
)


@_settings(40)
@given(tail=trailing_bytes)
def test_nothing_sent_after_an_answer_ever_answers_another_request(tail):
    async def run():
        async def trailing(reader, writer, n):
            writer.write(answer(b'{"n":%d}' % len(server.requests)) + (tail if len(server.requests) == 1 else b""))

        client = Http1Transport()
        try:
            async with Scripted(trailing) as server:
                for i in (1, 2):
                    got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
                    assert (got.status, await got.read()) == (200, b'{"n":%d}' % i)
        finally:
            await client.aclose()

    asyncio.run(run())


# ------------------------------------------------------------------ decompression bombs


def test_the_bomb_is_a_valid_gzip():
    assert gzip.decompress(gzip_bomb(3)) == bytes(3 << 20)


@pytest.mark.parametrize("how", ["read", "chunks"])
async def test_a_gzip_bomb_is_refused_with_bounded_memory(how):
    bomb = gzip_bomb(1024)  # about 1 MB that inflates to 1 GiB
    limit = 8 << 20

    async def bombing(reader, writer, n):
        writer.write(answer(bomb, headers="content-encoding: gzip\r\n"))

    client = Http1Transport(max_response_bytes=limit)
    async with Scripted(bombing) as server:
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        received = 0
        tracemalloc.start()
        try:
            with pytest.raises(ResponseTooLarge) as err:
                if how == "read":
                    await got.read()
                else:
                    async for chunk in got.chunks():
                        received += len(chunk)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            await client.aclose()
    assert err.value.limit == limit and received <= limit
    assert peak < 4 * limit  # never the gigabyte: at most the cap, plus one decompress past it


encodings = {
    "identity": lambda b: b,
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "raw-deflate": lambda b: zlib.compress(b)[2:-4],
}
bodies = st.one_of(st.binary(max_size=3000), st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=8),
                                                       st.integers(1, 2000)))


@_settings(200)
@given(body=bodies, encoding=st.sampled_from(sorted(encodings)), limit=st.integers(1, 5000),
       cuts=st.lists(st.integers(0, 4000), max_size=6))
def test_a_body_decodes_whole_within_the_limit_and_is_refused_past_it(body, encoding, limit, cuts):
    data = encodings[encoding](body)
    bounds = sorted({0, len(data), *[c for c in cuts if c < len(data)]})
    pieces = [data[a:b] for a, b in zip(bounds, bounds[1:])]
    reader = BodyReader(encoding.removeprefix("raw-"), limit)
    out: list[bytes] = []
    try:
        for piece in pieces:
            out.append(reader.feed(piece))
            assert sum(map(len, out)) <= limit  # never more decoded than the cap allows
        out.append(reader.end())
    except ResponseTooLarge:
        assert len(body) > limit
    else:
        assert b"".join(out) == body and len(body) <= limit


async def test_an_unencoded_answer_declared_past_the_limit_is_refused_before_its_body():
    async def huge(reader, writer, n):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (1 << 40))
        await asyncio.sleep(5)

    client = Http1Transport(max_response_bytes=1 << 20)
    try:
        async with Scripted(huge) as server:
            with pytest.raises(ResponseTooLarge):
                await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
    finally:
        await client.aclose()


# ------------------------------------------------------------------ header floods


@pytest.mark.parametrize("head", [
    b"".join(b"x-h%d: %s\r\n" % (i, b"a" * 1000) for i in range(8000)),
    b"x-big: " + b"a" * (8 << 20) + b"\r\n",
    b"x-same: v\r\n" * 10_000,
    b"".join(b"x-h%d: v\r\n" % i for i in range(MAX_HEADERS + 1)),
], ids=["8MB-of-headers", "one-8MB-header", "10k-of-one-name", "one-header-too-many"])
async def test_header_floods_are_refused(head, client):
    async def flooding(reader, writer, n):
        writer.write(b"HTTP/1.1 200 OK\r\n" + head + b"content-length: 2\r\n\r\nok")

    async with Scripted(flooding) as server:
        with pytest.raises(httpx.RemoteProtocolError, match="header"):
            await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        await asyncio.sleep(0.05)
        assert client._open == 0


header_fields = st.lists(st.tuples(st.sampled_from(["x-a", "x-b", "set-cookie", "x-ratelimit"]),
                                   st.sampled_from(string.ascii_letters), st.integers(1, 1500)), max_size=130)


@_settings(40)
@example(fields=[("x-a", "a", 600)] * 99)  # within both caps, near each
@example(fields=[("x-a", "a", 1500)] * 50)  # past the byte cap
@given(fields=header_fields)
def test_repeated_headers_are_joined_in_order_within_the_caps(fields):
    values = [(name, letter * size) for name, letter, size in fields]
    head = b"".join(b"%s: %s\r\n" % (name.encode(), value.encode()) for name, value in values)
    head += b"content-length: 2\r\n"
    count = len(values) + 1
    size = sum(len(name) + len(value) for name, value in values) + len("content-length") + 1
    raw_size = len(b"HTTP/1.1 200 OK\r\n") + len(head) + 2

    async def run():
        async def heads(reader, writer, n):
            writer.write(b"HTTP/1.1 200 OK\r\n" + head + b"\r\nok")

        client = Http1Transport()
        try:
            async with Scripted(heads) as server:
                try:
                    got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
                except httpx.RemoteProtocolError:
                    return None
                assert await got.read() == b"ok"
                return got.headers
        finally:
            await client.aclose()

    headers = asyncio.run(run())
    if headers is None:
        assert count > MAX_HEADERS or raw_size > MAX_HEADER_BYTES
    else:
        assert count <= MAX_HEADERS and size <= MAX_HEADER_BYTES
        for name in {name for name, _ in values}:
            assert headers[name] == ", ".join(value for n, value in values if n == name)


# ------------------------------------------------------------------ which requests are sent twice


async def test_a_post_whose_reused_connection_closes_unanswered_is_not_sent_twice(client):
    async def crashes_on_second(reader, writer, n):
        if len(server.requests) == 2:
            return False  # it read the POST, then died while generating: no byte of an answer
        writer.write(answer(b"ok"))

    async with Scripted(crashes_on_second) as server:
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        assert await got.read() == b"ok"
        with pytest.raises(httpx.RemoteProtocolError, match="not sent twice"):
            await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        assert len(server.requests) == 2  # the second POST reached the upstream exactly once
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        assert await got.read() == b"ok" and server.connections == 2


async def test_an_idle_connection_the_upstream_already_closed_carries_no_request(client):
    def closes_when_idle(sock, n):
        sock.sendall(answer(b'{"n":%d}' % n))
        sock.shutdown(socket.SHUT_WR)  # its keep-alive timeout: closed for writing, still reading

    with ThreadedScript(closes_when_idle) as server:
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        assert await got.read() == b'{"n":1}'
        time.sleep(0.3)  # the loop is blocked: the close waits unread as the pool picks the connection
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        assert await got.read() == b'{"n":2}'
        assert server.received == [1, 1]  # the POST went on a new connection only


# ------------------------------------------------------------------ framing and abandoned streams


@_settings(30)
@given(codings=st.lists(st.sampled_from(["chunked", "gzip", "deflate", "identity", "x-custom"]), min_size=1,
                        max_size=3),
       case=st.sampled_from([str.lower, str.upper, str.title]))
def test_only_plain_chunked_is_accepted_as_a_transfer_coding(codings, case):
    value = case(", ".join(codings))

    async def run():
        async def framed(reader, writer, n):
            writer.write(f"HTTP/1.1 200 OK\r\ntransfer-encoding: {value}\r\n\r\n".encode() + b"2\r\nok\r\n0\r\n\r\n")

        client = Http1Transport()
        try:
            async with Scripted(framed) as server:
                got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
                return await got.read()
        finally:
            await client.aclose()

    if codings == ["chunked"]:
        assert asyncio.run(run()) == b"ok"
    else:
        with pytest.raises(httpx.RemoteProtocolError):
            asyncio.run(run())


async def test_another_transfer_coding_is_a_502_from_the_runtime():
    async def gzip_chunked(reader, writer, n):
        data = gzip.compress(b'{"id":"x","choices":[]}')
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                     % (len(data), data))

    async with Scripted(gzip_chunked) as server:
        rt = UpstreamRuntime(upstream_url=f"http://127.0.0.1:{server.port}/v1")
        await rt.start()
        try:
            with pytest.raises(RuntimeUnavailable, match="RemoteProtocolError") as err:
                await rt.complete(InferenceCall("s", "r", {"model": "m", "messages": []}))
            assert err.value.status == 502  # refused as a protocol error, not read as a garbled body
        finally:
            await rt.aclose()


async def test_a_stream_nobody_reads_times_out_and_frees_its_connection():
    size = 8 << 20

    async def big_then_small(reader, writer, n):
        if len(server.requests) == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
            for _ in range(size >> 16):
                writer.write(b"y" * (1 << 16))
                await writer.drain()
        else:
            writer.write(answer(b"second"))

    client = Http1Transport(max_connections=1)
    async with Scripted(big_then_small) as server:
        got = await client.send("POST", server.url, HEADERS, b"{}", {"connect": 5, "read": 0.3, "pool": 5})
        stream = got.chunks()
        try:
            assert await stream.__anext__()
            # Its reader stops here: reading pauses once 1 MiB is buffered, and after the read
            # timeout the connection (the pool's only one) is closed, so the next request runs.
            second = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
            assert await second.read() == b"second"
            with pytest.raises(httpx.ReadTimeout):
                async for _ in stream:
                    pass
            assert server.connections == 2
        finally:
            await stream.aclose()
            await client.aclose()


async def test_an_answer_that_ends_as_its_reading_pauses_leaves_its_connection_reading():
    async def then_a_megabyte(reader, writer, n):
        if len(server.requests) == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\nfirst" % (5 + (1 << 20)))
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(b"y" * (1 << 20))  # the pause threshold is reached with the answer's last byte
        else:
            writer.write(answer(b"second"))

    client = Http1Transport(max_connections=1)
    async with Scripted(then_a_megabyte) as server:
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        stream = got.chunks()
        try:
            assert await stream.__anext__() == b"first"
            await asyncio.sleep(0.2)  # its reader takes nothing more: the answer ends, buffered
            second = await client.send("POST", server.url, HEADERS, b"{}", {"connect": 5, "read": 2, "pool": 5})
            assert await second.read() == b"second"  # the kept-alive connection was not left paused
            assert server.connections == 1
            assert len(b"".join([chunk async for chunk in stream])) == 1 << 20
        finally:
            await stream.aclose()
            await client.aclose()
