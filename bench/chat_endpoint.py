"""A scripted model behind a real OpenAI-compatible endpoint, in the bench's own process.

Some benches give a recipe a scripted party (a rule-based judge, an evolver that knows the
answer) through the same interface a model would use: the recipe's ``{url, model}`` option,
``POST /v1/chat/completions``. Subclasses answer ``reply(messages)``; this serves it on a free
loopback port until the ``with`` block ends.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ChatEndpoint(ABC):
    """``POST <url>/chat/completions`` answered by ``reply(messages) -> str``; ``url`` ends in ``/v1``."""

    model = "scripted"

    def __init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                text = owner.reply([m for m in body.get("messages") or [] if isinstance(m, dict)])
                out = json.dumps({"id": owner.model, "object": "chat.completion", "created": 0, "model": owner.model,
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": text}}]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @abstractmethod
    def reply(self, messages: list[dict[str, Any]]) -> str:
        """The assistant's text for one request's ``messages``."""

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
