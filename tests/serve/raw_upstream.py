"""A raw-socket upstream for hostile-upstream tests: a script decides the exact bytes of each answer
(``script(path, body)`` returns byte strings to send and numbers of seconds to pause; the
connection is closed after them). `http` and `sse_head` build the usual heads."""
from __future__ import annotations

import json
import socket
import threading
import time

from scripted import recv_request


class RawUpstream:
    def __init__(self, script):
        self.script = script  # (path, body: dict) -> list of bytes | float (sleep) ; connection closed after
        self.requests = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        try:
            got = recv_request(conn)
            if got is None:
                return
            head, rest, _ = got
            lines = head.decode().split("\r\n")
            path = lines[0].split()[1]
            hdrs = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
            body = json.loads(rest) if rest else {}
            self.requests.append((path, hdrs, body))
            for item in self.script(path, body):
                if isinstance(item, (int, float)):
                    time.sleep(item)
                else:
                    conn.sendall(item)
        except OSError:
            pass
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def close(self):
        self._stop = True
        self.sock.close()


def http(status=200, body=b"", ctype="application/json", extra=b"", length=True):
    head = f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\nconnection: close\r\n".encode() + extra
    if length:
        head += f"content-length: {len(body)}\r\n".encode()
    return head + b"\r\n" + body


def sse_head(ctype="text/event-stream", extra=b""):
    return f"HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\nconnection: close\r\n".encode() + extra + b"\r\n"
