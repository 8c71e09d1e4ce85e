"""An upstream answer's body as every transport reads it: the content encoding decoded with a
bound, and the decoded size capped (``max_response_bytes``), whole or as it streams.

Why a bound at all: gzip and deflate inflate up to ~1000 times, so a 1 MB answer can decode to
1 GiB, and ``zlib``'s ``decompress(data)`` returns all of it at once. Here each piece is
decompressed with ``max_length`` set to the room left under the cap plus one byte: an answer
within the cap decodes exactly as before (the input is consumed whole, nothing stays in the
decoder's ``unconsumed_tail``); one past it stops after producing that one byte too many, so a
bomb costs at most the cap in memory, and one ``zlib`` call, before it is refused.

The cap counts decoded bytes, streamed or not: Reef keeps a whole answer (the record of a
stream holds every event), so a stream is no way around it. Sizes are checked per piece the
network delivers, never per byte.
"""

from __future__ import annotations

import zlib
from typing import Any

import httpx

#: 64 MiB: the longest answers models give today (~128k output tokens) stream as about 30 MB
#: of server-sent events, so this leaves room for twice that; a runaway or hostile upstream
#: stops here instead of at the process's memory. Raise ``runtime.max_response_bytes`` for
#: long generations with per-token logprobs (about 1–2 KB a token).
DEFAULT_MAX_RESPONSE_BYTES = 64 << 20


class ResponseTooLarge(httpx.HTTPError):
    """The upstream's answer, decoded, is larger than the transport's ``max_response_bytes``."""

    def __init__(self, limit: int):
        super().__init__(f"the upstream's answer is larger than {limit} bytes (decoded)")
        self.limit = limit


class _Deflate:
    """``deflate`` as servers send it: zlib-wrapped per the RFC, or raw as some do."""

    __slots__ = ("_d", "_first")

    def __init__(self):
        self._d = zlib.decompressobj(zlib.MAX_WBITS)
        self._first = True

    def decompress(self, data: bytes, max_length: int) -> bytes:
        if self._first:
            self._first = False
            try:
                return self._d.decompress(data, max_length)
            except zlib.error:
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._d.decompress(data, max_length)

    def flush(self) -> bytes:
        return self._d.flush()


def _decoder(encoding: str | None) -> Any:
    name = (encoding or "identity").strip().lower()
    if name in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if name == "deflate":
        return _Deflate()
    if name == "identity":
        return None
    raise httpx.RemoteProtocolError(f"unsupported content-encoding {name[:40]!r}")


class BodyReader:
    """Decodes one answer's body piece by piece and counts it against ``limit``.

    Raises ``httpx.RemoteProtocolError`` (at construction) for an encoding it does not
    decode, ``httpx.DecodingError`` for a body that does not decode, and
    :class:`ResponseTooLarge` once the decoded body passes ``limit``; ``content_length``
    (the header's text), when given for an unencoded body, refuses a too-large answer before
    any of it is read."""

    __slots__ = ("_decoder", "room", "limit")

    def __init__(self, content_encoding: str | None, limit: int, content_length: str | None = None):
        self._decoder = None if content_encoding is None else _decoder(content_encoding)
        self.limit = limit
        self.room = limit  # decoded bytes still allowed
        if self._decoder is None and content_length is not None and content_length.isdigit() \
                and int(content_length) > limit:
            raise ResponseTooLarge(limit)

    def feed(self, data: bytes) -> bytes:
        """``data`` from the network, decoded (possibly empty)."""
        decoder = self._decoder
        if decoder is not None:
            try:
                data = decoder.decompress(data, self.room + 1)  # at most one byte past the cap
            except zlib.error as exc:
                raise httpx.DecodingError(f"the upstream's body does not decode ({exc})") from None
        self.room -= len(data)
        if self.room < 0:
            raise ResponseTooLarge(self.limit)
        return data

    def end(self) -> bytes:
        """What the decoder still holds once the body is whole."""
        if self._decoder is None:
            return b""
        try:
            tail = self._decoder.flush()  # the input was consumed whole: bounded by what it held
        except zlib.error as exc:
            raise httpx.DecodingError(f"the upstream's body does not decode ({exc})") from None
        self.room -= len(tail)
        if self.room < 0:
            raise ResponseTooLarge(self.limit)
        return tail


__all__ = ["DEFAULT_MAX_RESPONSE_BYTES", "BodyReader", "ResponseTooLarge"]
