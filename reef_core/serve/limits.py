"""A pure-ASGI guard on request body size (``server.max_body_bytes``).

A declared ``content-length`` over the limit is refused before the app runs; a chunked body
is counted as it is read and refused with ``BodyTooLarge`` (a 413 in the route's shape).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import jsonfast
from .errors import BodyTooLarge, dialect_of, error_body


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                break
        if declared is not None and declared > self.limit:
            await _refuse(scope, send, BodyTooLarge(self.limit))
            return
        if declared is not None and declared >= 0:
            await self.app(scope, receive, send)
            return
        seen = 0
        limit = self.limit

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counting_receive, send)


async def _refuse(scope: Scope, send: Send, exc: BodyTooLarge) -> None:
    body = jsonfast.dumps(error_body(dialect_of(scope["path"]), 413, str(exc)))
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
