"""Kept importable from here: the aiohttp-backed httpx transport lives in ``reef_core.kit.http_transport``."""

from ..kit.http_transport import AiohttpTransport, available

__all__ = ["AiohttpTransport", "available"]
