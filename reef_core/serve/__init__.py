"""Serve: the FastAPI app, provider-compatible routes, receipts, feedback and auth."""

from .app import create_app

__all__ = ["create_app"]
