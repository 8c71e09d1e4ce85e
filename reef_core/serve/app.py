"""The FastAPI application factory."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from ..kernel import Reef


def create_app(reef: Reef) -> FastAPI:
    """Build the app serving ``reef``; the kernel starts and stops with the app."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await reef.start()
        try:
            yield
        finally:
            await reef.stop()

    app = FastAPI(title="Reef", version="0.1.0", lifespan=lifespan)
    app.state.reef = reef

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict:
        """Liveness: the HTTP server is up (no auth)."""
        return {"ok": True}

    from .routes_learning import router as learning_router

    app.include_router(learning_router)
    return app
