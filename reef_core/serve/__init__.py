"""Serve: the FastAPI app, provider-compatible routes, receipts, feedback and auth."""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # Lazy, so that light modules (jsonfast, dialects) import without FastAPI and the kernel.
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
