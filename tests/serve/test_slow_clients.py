"""Slow, broken and greedy clients at the HTTP connection level (reef_core/serve/edge.py), over real sockets.

Timeouts are small here (0.5 s); bounds on elapsed time only prove "closed, not hung".
"""

from __future__ import annotations

import json
import select
import socket
import time

import pytest

from reef_core.serve.edge import EdgeLimits, derived_max_connections, uvicorn_options
from reef_core.testing import ReefServer, reef_settings

TIMEOUT = 0.5
#: a connection the server should close is closed within this many seconds, or the test fails
NO_HANG = TIMEOUT * 10 + 2
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
#: the raw requests here say "Host: x"
ALLOW_X = "server.allowed_hosts=[x]"


@pytest.fixture(scope="module")
def reef(upstreams, tmp_path_factory):
    with ReefServer(tmp_path_factory.mktemp("slow"), upstream=upstreams["openai"],
                    overrides=[f"server.header_timeout_s={TIMEOUT}", f"server.body_timeout_s={TIMEOUT}",
                               "server.max_connections=20", ALLOW_X]) as server:
        yield server


def _connect(server: ReefServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=NO_HANG)


def _read_until_closed(sock: socket.socket, limit: float = NO_HANG) -> bytes:
    """Everything the server sends until it closes the connection; fails if it stays open past ``limit``."""
    deadline = time.monotonic() + limit
    data = b""
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"the server kept the connection open for more than {limit}s (got {data[:200]!r})"
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def _assert_json_error(raw: bytes, status: int, error_type: str, *, openai: bool = False) -> str:
    """``raw`` is one JSON error answer with ``connection: close``; returns its message. On an
    OpenAI route the error has OpenAI's shape (as the app's own errors there do)."""
    got, headers, body = _parse(raw)
    assert got == status, raw[:300]
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    if openai:
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"
    else:
        assert error["type"] == error_type
    return error["message"]


def _trickle_until_closed(sock: socket.socket, payload: bytes, pause: float = 0.05) -> bytes:
    """Send ``payload`` one byte at a time (repeating its last byte forever) until the server
    answers or closes; returns what it sent. Fails past ``NO_HANG`` seconds."""
    deadline = time.monotonic() + NO_HANG
    i = 0
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], pause)
        if readable:
            return _read_until_closed(sock)
        try:
            sock.sendall(payload[min(i, len(payload) - 1):][:1])
        except (BrokenPipeError, ConnectionResetError):
            return _read_until_closed(sock)
        i += 1
    raise AssertionError(f"the server kept a trickling connection open for more than {NO_HANG}s")


def test_slowloris_headers_are_closed(reef):
    with _connect(reef) as s:
        raw = _trickle_until_closed(s, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000)
    message = _assert_json_error(raw, 408, "request_timeout")
    assert "server.header_timeout_s" in message


def test_idle_new_connection_is_closed(reef):
    with _connect(reef) as s:
        raw = _read_until_closed(s)
    _assert_json_error(raw, 408, "request_timeout")


def test_slow_second_request_on_a_keepalive_connection_is_closed(reef):
    with _connect(reef) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while b'{"ok":true}' not in first:
            chunk = s.recv(65536)
            assert chunk, first
            first += chunk
        assert _parse(first)[0] == 200
        raw = _trickle_until_closed(s, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000)
    _assert_json_error(raw, 408, "request_timeout")


def _read_one_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    _, headers, body = _parse(data)
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, data
        body += chunk
        data += chunk
    return data


def test_idle_keepalive_is_not_a_header_timeout(reef):
    """Between requests the connection idles under uvicorn's keep-alive timeout (5 s), not the header clock."""
    with _connect(reef) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _parse(_read_one_response(s))[0] == 200
        time.sleep(TIMEOUT * 3)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _parse(_read_one_response(s))[0] == 200


def test_slow_answer_is_not_a_client_timeout(reef, upstreams):
    """The app taking longer than both timeouts to answer is not the client's slowness, even when
    the client sent a stray CRLF after its body (as some old clients do)."""
    body = json.dumps(CHAT).encode()
    upstreams["openai"].hang(seconds=TIMEOUT * 3)
    with _connect(reef) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.1)
        s.sendall(b"\r\n")
        status, _, answer = _parse(_read_one_response(s))
    assert status == 200, answer
    assert json.loads(answer)["choices"][0]["message"]["content"]


def test_stalled_body_gets_408_and_is_closed(reef):
    with _connect(reef) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 100\r\n\r\n{\"model\"")
        raw = _read_until_closed(s)
    message = _assert_json_error(raw, 408, "request_timeout", openai=True)
    assert "server.body_timeout_s" in message
    assert reef.client().get("/healthz").status_code == 200


def test_stalled_chunked_body_gets_408(reef):
    with _connect(reef) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                  b"transfer-encoding: chunked\r\n\r\n5\r\n{\"mod\r\n")
        raw = _read_until_closed(s)
    _assert_json_error(raw, 408, "request_timeout", openai=True)


def test_body_with_short_pauses_is_served(reef):
    """The body timeout bounds each pause, not the whole body: pieces 0.1 s apart for longer than
    the timeout in total still make a request."""
    body = json.dumps(CHAT).encode()
    pieces = [body[i:i + 4] for i in range(0, len(body), 4)][:12]
    pieces.append(body[4 * len(pieces):])
    with _connect(reef) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                  b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body))
        started = time.monotonic()
        for piece in pieces:
            time.sleep(0.1)
            s.sendall(piece)
        assert time.monotonic() - started > TIMEOUT
        raw = _read_until_closed(s)
    status, _, answer = _parse(raw)
    assert status == 200, raw[:300]
    assert json.loads(answer)["choices"][0]["message"]["content"]


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-B\x00d: a\r\n\r\n",
    b"GET /health\xffz HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\nHost: x\n\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
], ids=["request-line", "nul-in-value", "nul-in-name", "url-byte", "bare-lf", "chunk-size"])
def test_malformed_framing_is_json_400(reef, raw):
    with _connect(reef) as s:
        s.sendall(raw)
        answer = _read_until_closed(s)
    message = _assert_json_error(answer, 400, "bad_request", openai=raw.startswith(b"POST /v1/chat"))
    assert message.startswith("malformed HTTP request: ")


def test_oversized_headers_get_431(reef):
    with _connect(reef) as s:  # complete, in one write: the exact check once the head is parsed
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n")
        raw = _read_until_closed(s)
    assert "server.max_header_bytes" in _assert_json_error(raw, 431, "headers_too_large")
    with _connect(reef) as s:  # never ending: refused while it arrives, before the timeout
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        for _ in range(10):
            s.sendall(b"X-Many: " + b"b" * 4000 + b"\r\n")
        raw = _read_until_closed(s)
    _assert_json_error(raw, 431, "headers_too_large")


def test_large_headers_under_the_limit_are_served(reef):
    r = reef.client().get("/healthz", headers={"x-big": "a" * 30_000})
    assert r.status_code == 200 and r.json() == {"ok": True}


def test_normal_streamed_and_pipelined_requests_work(reef):
    with reef.client() as c:
        for _ in range(3):  # one keep-alive connection
            assert c.get("/healthz").status_code == 200
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as stream:
            assert stream.status_code == 200
            text = "".join(stream.iter_text())
        assert text.rstrip().endswith("data: [DONE]")
    with _connect(reef) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n")
        raw = _read_until_closed(s)
    assert raw.count(b"HTTP/1.1 200 OK") == 2


def test_connection_cap(upstreams, tmp_path):
    """Past the cap new connections are refused at once; established ones keep working; once the
    slow connections are closed (by the header timeout) new clients are served again."""
    cap = 20
    with ReefServer(tmp_path, upstream=upstreams["openai"],
                    overrides=["server.header_timeout_s=2", f"server.max_connections={cap}", ALLOW_X]) as reef:
        established = _connect(reef)
        slow: list[socket.socket] = []
        try:
            established.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _read_one_response(established).startswith(b"HTTP/1.1 200")
            slow = [_connect(reef) for _ in range(cap - 1)]
            for s in slow:
                s.sendall(b"GET /healthz HTTP/1.1\r\n")  # and never more
            with _connect(reef) as refused:
                raw = _read_until_closed(refused, limit=1.5)
            _assert_json_error(raw, 503, "unavailable")
            assert _parse(raw)[1]["retry-after"] == "1"

            established.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _read_one_response(established).startswith(b"HTTP/1.1 200")

            for s in slow:
                _assert_json_error(_read_until_closed(s), 408, "request_timeout")
            deadline = time.monotonic() + NO_HANG
            while True:  # the server forgets a closed connection right after the client sees it close
                with reef.client() as c:
                    try:
                        if c.get("/healthz").status_code == 200:
                            break
                    except Exception:
                        pass
                assert time.monotonic() < deadline, "no client served after the slow connections closed"
                time.sleep(0.05)
        finally:
            established.close()
            for s in slow:
                s.close()


def test_derived_connection_cap():
    assert derived_max_connections(256) == 96          # half of what the reserve leaves: one upstream socket each
    assert derived_max_connections(1024) == 480
    assert derived_max_connections(20) == 16
    assert derived_max_connections(1 << 20) == 4096
    assert 16 <= derived_max_connections() <= 4096


def test_uvicorn_options_follow_settings(tmp_path):
    settings = reef_settings(tmp_path, ["server.header_timeout_s=3", "server.body_timeout_s=4",
                                        "server.max_header_bytes=2048"])
    options = uvicorn_options(settings)
    assert options["http"].limits == EdgeLimits(header_timeout_s=3, body_timeout_s=4,
                                                max_connections=derived_max_connections(), max_header_bytes=2048)
    assert "limit_concurrency" not in options
