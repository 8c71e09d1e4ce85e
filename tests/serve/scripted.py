"""Scripted upstreams for the HTTP client tests: raw servers that answer exactly the bytes a
test gives them, well-formed or hostile.

``Scripted`` runs on the test's own event loop. ``ThreadedScript`` runs in threads with
blocking sockets, for tests that block their loop on purpose (so that bytes, or a close, wait
unread in the kernel when the client picks a connection) or that serve a Reef in a thread.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import zlib


def recv_request(sock: socket.socket, data: bytes = b"") -> tuple[bytes, bytes, bytes] | None:
    """Read one request from a blocking socket, ``data`` already read before it: its head, its
    body (by ``content-length``) and what arrived after it; None when the peer closes first."""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            return None
        data += more
    head, data = data.split(b"\r\n\r\n", 1)
    length = _content_length(head)
    while len(data) < length:
        more = sock.recv(65536)
        if not more:
            return None
        data += more
    return head, data[:length], data[length:]


def answer(body: bytes = b'{"ok":true}', *, headers: str = "", status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n{headers}\r\n".encode() + body


def gzip_bomb(mib: int) -> bytes:
    """gzip of ``mib`` MiB of zeros, about 1 KB a MiB, built without compressing them all."""
    zeros = bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    again = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)  # every later MiB: these same bytes
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    # an empty final block with the last-block bit, then gzip's trailer: CRC-32 and size mod 2**32
    return first + again * (mib - 1) + b"\x03\x00" + crc.to_bytes(4, "little") + ((mib << 20) % (1 << 32)).to_bytes(4, "little")


def _content_length(head: bytes) -> int:
    return next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")), 0)


class Scripted:
    """A TCP server whose every connection runs ``handler(reader, writer, n)``, ``n`` counting
    the connection's requests; it keeps each request's head and body."""

    def __init__(self, handler):
        self.handler = handler
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.server = None
        self.ssl = None

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        await asyncio.sleep(0)

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl else 'http'}://{'localhost' if self.ssl else '127.0.0.1'}:{self.port}/v1/chat"

    async def _serve(self, reader, writer):
        self.connections += 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                body = await reader.readexactly(_content_length(head))
                self.requests.append((head, body))
                n += 1
                if await self.handler(reader, writer, n) is False:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


class ThreadedScript:
    """A TCP server in threads: each request calls ``handler(sock, n)`` (``n`` counting every
    request the server received, on any connection), which writes with ``sock.sendall`` and
    returns False to close the connection. ``received[i]`` counts connection ``i``'s requests."""

    def __init__(self, handler):
        self.handler = handler
        self.received: list[int] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat"

    @property
    def requests(self) -> int:
        return sum(self.received)

    def __enter__(self):
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._listener.close()
        for sock in self._open:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self):
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self._open.append(sock)
            with self._lock:
                self.received.append(0)
                index = len(self.received) - 1
            threading.Thread(target=self._serve, args=(sock, index), daemon=True).start()

    def _serve(self, sock: socket.socket, index: int):
        data = b""
        try:
            while True:
                got = recv_request(sock, data)
                if got is None:
                    return
                data = got[2]
                with self._lock:
                    self.received[index] += 1
                    n = self.requests
                if self.handler(sock, n) is False:
                    return
        except OSError:
            pass
        finally:
            sock.close()
