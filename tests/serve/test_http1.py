"""Reef's own HTTP/1.1 upstream client (``reef_core.kit.http1``) against scripted servers:
the answers a model server may give, keep-alive and its races, timeouts, the pool's limit,
encodings, TLS, and what a cancelled or abandoned request leaves behind."""

from __future__ import annotations

import asyncio
import gzip
import shutil
import ssl
import subprocess
import zlib

import httpx
import pytest
from scripted import Scripted, answer

from reef_core.kit.http1 import Http1Transport

HEADERS = [("content-type", "application/json"), ("authorization", "Bearer k")]
TIMEOUT = {"connect": 5, "read": 5, "pool": 5}


@pytest.fixture
async def client():
    transport = Http1Transport()
    yield transport
    await transport.aclose()


async def plain(reader, writer, n):
    writer.write(answer(b'{"n":%d}' % n))


async def test_a_request_and_its_answer_and_keep_alive(client):
    async with Scripted(plain) as server:
        for i in range(3):
            got = await client.send("POST", server.url, HEADERS, b'{"q":%d}' % i, TIMEOUT)
            assert got.status == 200 and got.headers["content-length"] == "7"
            assert await got.read() == b'{"n":%d}' % (i + 1)
            await got.aclose()
        assert server.connections == 1  # one kept-alive connection carried all three
        head, body = server.requests[0]
        assert head.startswith(b"POST /v1/chat HTTP/1.1\r\n") and body == b'{"q":0}'
        lines = head.lower().split(b"\r\n")
        assert f"host: 127.0.0.1:{server.port}".encode() in lines and b"authorization: bearer k" in lines
        assert b"accept-encoding: gzip, deflate" in lines and b"content-length: 7" in lines


async def test_chunked_answers_arrive_as_they_are_sent(client):
    async def chunked(reader, writer, n):
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n")
        for i in range(3):
            data = b"data: %d\n\n" % i
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")

    async with Scripted(chunked) as server:
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        pieces = [c async for c in got.chunks()]
        assert b"".join(pieces) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n" and len(pieces) >= 2
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        assert await got.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert server.connections == 1


async def test_an_answer_that_ends_with_the_connection(client):
    async def until_close(reader, writer, n):
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        return False

    async with Scripted(until_close) as server:
        for _ in range(2):
            got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
            assert await got.read() == b"all of it"
        assert server.connections == 2


async def test_an_informational_answer_before_the_real_one(client):
    async def early_hints(reader, writer, n):
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + answer(b"real"))

    async with Scripted(early_hints) as server:
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        assert got.status == 200 and "link" not in got.headers and await got.read() == b"real"


async def test_an_idempotent_request_on_a_kept_alive_connection_closed_before_answering_is_sent_again(client):
    async def closes_second(reader, writer, n):
        if len(server.requests) == 2:
            return False  # as in the idle-timeout race: the request arrives as the server closes
        writer.write(answer(b"ok"))

    async with Scripted(closes_second) as server:
        for _ in range(3):
            got = await client.send("GET", server.url, HEADERS, None, TIMEOUT)
            assert await got.read() == b"ok"
        assert server.connections == 2 and len(server.requests) == 4  # the second was sent twice


async def test_a_new_connection_closed_without_an_answer_is_an_error(client):
    async def never(reader, writer, n):
        return False

    async with Scripted(never) as server:
        with pytest.raises(httpx.RemoteProtocolError, match="without answering"):
            await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        assert client._open == 0


async def test_bytes_past_the_end_of_an_answer_retire_its_connection(client):
    async def trailing(reader, writer, n):
        writer.write(answer(b"ok") + b"garbage that is no answer\r\n\r\n")

    async with Scripted(trailing) as server:
        for _ in range(2):
            got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
            assert await got.read() == b"ok"
        assert server.connections == 2  # the first connection was not handed out again


@pytest.mark.parametrize("reply,error", [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", httpx.RemoteProtocolError),
    (b"NOT HTTP AT ALL\r\n\r\n", httpx.RemoteProtocolError),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncontent-encoding: br\r\n\r\nabcd", httpx.RemoteProtocolError),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncontent-encoding: gzip\r\n\r\nabcd", httpx.DecodingError),
    (b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\nconnection: upgrade\r\n\r\n", httpx.RemoteProtocolError),
], ids=["cut-body", "malformed", "unknown-encoding", "bad-gzip", "upgrade"])
async def test_broken_answers_are_httpx_errors(reply, error, client):
    async def broken(reader, writer, n):
        writer.write(reply)
        await writer.drain()
        return False

    async with Scripted(broken) as server:
        with pytest.raises(error):
            got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
            await got.read()
        await asyncio.sleep(0.05)
        assert client._open == 0 and not client._idle.get(("http", "127.0.0.1", server.port))


@pytest.mark.parametrize("encoding,encode", [
    ("gzip", gzip.compress),
    ("deflate", zlib.compress),
    ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, as some servers send it
], ids=["gzip", "deflate", "raw-deflate"])
async def test_encoded_answers_are_decoded(encoding, encode, client):
    text = b'{"content":"' + b"h\xc3\xa9llo " * 400 + b'"}'

    async def encoded(reader, writer, n):
        writer.write(answer(encode(text), headers=f"content-encoding: {encoding}\r\n"))

    async with Scripted(encoded) as server:
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        assert await got.read() == text
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        assert b"".join([c async for c in got.chunks()]) == text


async def test_the_read_timeout_is_between_reads(client):
    async def slow(reader, writer, n):
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(6):  # 0.6 s in all, never 0.3 s without a byte
            await asyncio.sleep(0.1)
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
        if n == 1:
            writer.write(b"0\r\n\r\n")
        else:
            await asyncio.sleep(5)

    async with Scripted(slow) as server:
        got = await client.send("POST", server.url, HEADERS, b"{}", {"connect": 5, "read": 0.3, "pool": 5})
        assert await got.read() == b"x" * 6
        got = await client.send("POST", server.url, HEADERS, b"{}", {"connect": 5, "read": 0.3, "pool": 5})
        with pytest.raises(httpx.ReadTimeout):
            await got.read()


async def test_no_answer_at_all_is_a_read_timeout(client):
    async def silent(reader, writer, n):
        await asyncio.sleep(5)

    async with Scripted(silent) as server:
        with pytest.raises(httpx.ReadTimeout):
            await client.send("POST", server.url, HEADERS, b"{}", {"connect": 5, "read": 0.2, "pool": 5})


async def test_the_pool_limit_queues_requests_and_its_timeout_is_a_pool_timeout():
    release = asyncio.Event()

    async def gated(reader, writer, n):
        await release.wait()
        writer.write(answer(b"ok"))

    async with Scripted(gated) as server:
        client = Http1Transport(max_connections=1)
        try:
            first = asyncio.create_task(client.send("POST", server.url, HEADERS, b"{}", TIMEOUT))
            await asyncio.sleep(0.05)
            with pytest.raises(httpx.PoolTimeout):
                await client.send("POST", server.url, HEADERS, b"{}", {"connect": 5, "read": 5, "pool": 0.1})
            second = asyncio.create_task(client.send("POST", server.url, HEADERS, b"{}", TIMEOUT))
            await asyncio.sleep(0.05)
            assert not second.done()
            release.set()
            for task in (first, second):
                assert await (await task).read() == b"ok"
            assert server.connections == 1
        finally:
            await client.aclose()


async def test_a_cancelled_request_gives_its_connection_back():
    async def silent(reader, writer, n):
        await asyncio.sleep(5)

    async with Scripted(silent) as server:
        client = Http1Transport(max_connections=1)
        try:
            task = asyncio.create_task(client.send("POST", server.url, HEADERS, b"{}", TIMEOUT))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.05)
            assert client._open == 0
        finally:
            await client.aclose()


async def test_an_answer_closed_unread_does_not_go_back_to_the_pool(client):
    async def big(reader, writer, n):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10)

    async with Scripted(big) as server:
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        await got.aclose()
        await asyncio.sleep(0.05)
        assert client._open == 0


async def test_a_large_streamed_answer_is_read_with_backpressure(client):
    size = 6 << 20

    async def large(reader, writer, n):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for _ in range(size >> 16):
            writer.write(b"y" * (1 << 16))
            await writer.drain()

    async with Scripted(large) as server:
        got = await client.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        total = 0
        async for chunk in got.chunks():
            total += len(chunk)
            await asyncio.sleep(0)  # a consumer slower than the socket
        assert total == size


async def test_under_an_httpx_client_get_post_and_stream():
    async def route(reader, writer, n):
        head = server.requests[-1][0]
        if head.startswith(b"GET /v1/models"):
            writer.write(answer(b'{"data":[{"id":"m"}]}'))
        elif b"stream" in server.requests[-1][1]:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n")
        else:
            writer.write(answer(gzip.compress(b'{"ok":1}'), headers="content-encoding: gzip\r\n"))

    async with Scripted(route) as server:
        base = server.url.rsplit("/v1", 1)[0]
        async with httpx.AsyncClient(transport=Http1Transport(), base_url=base,
                                     headers={"accept-encoding": "br, zstd"}) as client:
            models = await client.get("/v1/models")
            assert models.json() == {"data": [{"id": "m"}]}
            got = await client.post("/v1/chat/completions", json={"q": 1})
            assert got.json() == {"ok": 1} and "content-encoding" not in got.headers
            async with client.stream("POST", "/v1/chat/completions", json={"stream": True}) as resp:
                lines = [line async for line in resp.aiter_lines() if line]
            assert lines == ["data: 1", "data: 2"]
        get_head = server.requests[0][0].lower().split(b"\r\n")
        assert not any(line.startswith(b"content-length") for line in get_head)  # a GET without a body
        assert all(b"accept-encoding: gzip, deflate" in head.lower().split(b"\r\n") and b"br" not in head.lower()
                   for head, _ in server.requests)  # only what the client decodes
        assert server.connections == 1


async def test_under_an_httpx_client_failures_carry_the_request():
    async def never(reader, writer, n):
        return False

    async with Scripted(never) as server:
        async with httpx.AsyncClient(transport=Http1Transport()) as client:
            with pytest.raises(httpx.RemoteProtocolError) as err:
                await client.post(server.url, json={})
            assert err.value.request.url == server.url


@pytest.mark.parametrize("name,value", [("x-evil", "a\r\nx-injected: 1"), ("bad name", "v"), ("x:y", "v")])
async def test_headers_that_would_break_the_request_are_refused(name, value, client):
    with pytest.raises(ValueError, match="invalid HTTP header"):
        await client.send("POST", "http://127.0.0.1:9/v1", [(name, value)], b"{}", TIMEOUT)


async def test_urls_it_cannot_reach_are_httpx_errors(client):
    with pytest.raises(httpx.UnsupportedProtocol):
        await client.send("POST", "ftp://127.0.0.1/v1", [], b"{}", TIMEOUT)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
async def test_https_with_a_verified_certificate(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    scripted = Scripted(plain)
    scripted.ssl = server_side
    async with scripted as server:
        trusting = Http1Transport(ssl_context=ssl.create_default_context(cafile=str(cert)))
        try:
            got = await trusting.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
            assert await got.read() == b'{"n":1}'
            head = server.requests[0][0].lower()
            assert f"host: localhost:{server.port}".encode() in head.split(b"\r\n")
        finally:
            await trusting.aclose()
        stranger = Http1Transport()  # the system's CAs do not know this certificate
        try:
            with pytest.raises(httpx.ConnectError):
                await stranger.send("POST", server.url, HEADERS, b"{}", TIMEOUT)
        finally:
            await stranger.aclose()
