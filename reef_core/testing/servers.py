"""Run an ASGI app under uvicorn on a random loopback port, in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


class ServerThread:
    """``uvicorn`` serving ``app`` on ``127.0.0.1:<random port>`` in a daemon thread.

    Real sockets (unlike an ASGI transport) let official SDKs, streaming disconnects and
    subprocess clients talk to the app. ``start()`` returns once the app's lifespan start-up
    finished; ``stop()`` runs its shutdown (graceful for ``graceful_s`` seconds). ``options``
    are further ``uvicorn.Config`` keyword arguments (e.g. ``reef_core.serve.edge.uvicorn_options``).
    """

    def __init__(self, app: Any, *, log_level: str = "warning", lifespan: str = "on", graceful_s: float = 5,
                 options: dict[str, Any] | None = None):
        self.app = app
        self.options = dict(options or {})
        self.log_level = log_level
        self.lifespan = lifespan
        self.graceful_s = graceful_s
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None
        self.port: int = 0
        self.error: BaseException | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (no trailing slash); ``https`` when ``options`` hold an
        ``ssl_certfile``."""
        scheme = "https" if self.options.get("ssl_certfile") else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> ServerThread:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level=self.log_level, lifespan=self.lifespan, access_log=False,
                                timeout_graceful_shutdown=self.graceful_s, **self.options)
        self.server = uvicorn.Server(config)

        def run() -> None:
            try:
                self.server.run(sockets=[sock])
            except BaseException as exc:  # reported by start()
                self.error = exc
            finally:
                sock.close()

        self.thread = threading.Thread(target=run, name=f"uvicorn-{self.port}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"the server on port {self.port} failed to start: {self.error!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server on port {self.port} did not start within {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)
            self.thread = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
