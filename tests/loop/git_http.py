"""A git smart-HTTP server on loopback for tests: ``git http-backend`` behind a small CGI
bridge, so pushes and fetches go through the same protocol a hosted git server speaks.
(It serves git only; Git LFS needs an LFS API that ``http-backend`` does not have.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


class _Handler(BaseHTTPRequestHandler):
    root: Path

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._cgi(b"")

    def do_POST(self) -> None:  # noqa: N802
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
            self._cgi(bytes(body))
        else:
            self._cgi(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def _cgi(self, body: bytes) -> None:
        url = urlsplit(self.path)
        env = {
            "PATH": os.environ.get("PATH", ""), "GIT_PROJECT_ROOT": str(self.root), "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
            "REQUEST_METHOD": self.command, "PATH_INFO": url.path, "QUERY_STRING": url.query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": "reef", "REMOTE_ADDR": "127.0.0.1", "SERVER_PROTOCOL": "HTTP/1.1",
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
        }
        out = subprocess.run([shutil.which("git") or "git", "http-backend"], input=body, env=env,
                             capture_output=True, check=False).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:  # quiet
        pass


class GitHttpServer:
    """Serves the bare repositories under ``root`` at ``http://127.0.0.1:<port>/<name>``
    (pushes allowed: ``http.receivepack`` is set on each repository it is asked to create)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        handler = type("Handler", (_Handler,), {"root": self.root})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def bare(self, name: str) -> str:
        """Create the bare repository ``name`` (pushable over HTTP); return its URL."""
        path = self.root / name
        env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
        subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True, env=env)
        subprocess.run(["git", f"--git-dir={path}", "config", "http.receivepack", "true"], check=True, env=env)
        return f"http://127.0.0.1:{self._server.server_address[1]}/{name}"

    def __enter__(self) -> GitHttpServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
