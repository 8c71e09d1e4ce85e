"""The upstream transports' own interface: ``send`` on Reef's HTTP/1.1 pool, aiohttp's and httpx's, the
httpx-transport face of ``AiohttpTransport``, content encodings and error types."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reef_core.kit import http_transport
from reef_core.kit.http1 import Http1Transport
from reef_core.testing import ServerThread

pytestmark = pytest.mark.skipif(not http_transport.available(), reason="aiohttp is not installed")

PAYLOAD = {"id": "x", "choices": [{"message": {"content": "héllo " * 50}}]}


async def _echo(request: Request) -> Response:
    body = await request.body()
    data = json.dumps({**PAYLOAD, "got": json.loads(body), "auth": request.headers.get("authorization")}).encode()
    if request.query_params.get("gzip"):
        return Response(gzip.compress(data), media_type="application/json", headers={"content-encoding": "gzip"})
    return Response(data, media_type="application/json", headers={"x-upstream": "yes"})


@pytest.fixture(scope="module")
def upstream():
    server = ServerThread(Starlette(routes=[Route("/v1/chat/completions", _echo, methods=["POST"])])).start()
    yield server
    server.stop()


def _senders():
    return [http_transport.AiohttpTransport(), http_transport.httpx_transport(), Http1Transport()]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["aiohttp", "httpx", "http1"])
@pytest.mark.parametrize("query", ["", "?gzip=1"], ids=["plain", "gzip"])
async def test_send_reads_whole_and_in_chunks(upstream, which, query):
    sender = _senders()[which]
    url = f"{upstream.url}/v1/chat/completions{query}"
    headers = [("content-type", "application/json"), ("authorization", "Bearer k")]
    try:
        answer = await sender.send("POST", url, headers, b'{"q":1}', {"connect": 5, "read": 5, "pool": 5})
        assert answer.status == 200 and answer.headers["content-type"] == "application/json"
        body = json.loads(await answer.read())
        await answer.aclose()
        assert body["got"] == {"q": 1} and body["auth"] == "Bearer k" and body["choices"] == PAYLOAD["choices"]
        answer = await sender.send("POST", url, headers, b'{"q":2}')
        chunks = [c async for c in answer.chunks()]
        await answer.aclose()
        assert json.loads(b"".join(chunks))["got"] == {"q": 2}
    finally:
        await sender.aclose()


@pytest.mark.parametrize("which", [0, 1, 2], ids=["aiohttp", "httpx", "http1"])
async def test_an_unreachable_upstream_is_httpx_connect_error(which):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        sender = _senders()[which]
        try:
            with pytest.raises(httpx.ConnectError):
                await sender.send("POST", f"http://127.0.0.1:{port}/v1/chat/completions", [], b"{}",
                                  {"connect": 2, "read": 2, "pool": 2})
        finally:
            await sender.aclose()


@pytest.mark.parametrize("transport", [http_transport.AiohttpTransport, Http1Transport], ids=["aiohttp", "http1"])
async def test_transport_under_an_httpx_client(upstream, transport):
    async with httpx.AsyncClient(transport=transport(), base_url=upstream.url) as client:
        r = await client.post("/v1/chat/completions?gzip=1", json={"q": 3})
        assert r.status_code == 200 and r.json()["got"] == {"q": 3}
        assert "content-encoding" not in r.headers  # decoded once, by the transport
        r = await client.post("/v1/chat/completions", json={"q": 4})
        assert r.headers["x-upstream"] == "yes" and r.json()["choices"] == PAYLOAD["choices"]


@pytest.mark.parametrize("first_loop_alive", [False, True], ids=["closed", "running"])
def test_http1_used_from_another_event_loop_starts_its_pool_there(upstream, first_loop_alive):
    transport = Http1Transport()

    async def once(q):
        got = await transport.send("POST", f"{upstream.url}/v1/chat/completions", [], b'{"q":%d}' % q,
                                   {"connect": 5, "read": 5, "pool": 5})
        return json.loads(await got.read())["got"]["q"]

    if first_loop_alive:
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(once(1)) == 1
            (first,) = transport._conns
            assert asyncio.run(once(2)) == 2  # the first loop is idle, not closed
            loop.run_until_complete(asyncio.sleep(0.05))  # where the old connection is closed
            assert first.lost and first not in transport._conns
        finally:
            loop.close()
    else:
        assert asyncio.run(once(1)) == 1
        assert asyncio.run(once(2)) == 2
