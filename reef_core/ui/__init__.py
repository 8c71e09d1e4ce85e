"""The dashboard at ``/ui``: server-rendered pages over the kernel's own read routes.

Jinja2 templates (``templates/``) and a vendored htmx (``static/``) ship in the wheel:
nothing is built at install time and nothing is fetched from a CDN. Pages reuse the API's
route functions with the session's principal (``reef_core.serve.auth``), so roles and
scenario limits are the API's. See ``docs/ui.md``.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from .rendering import STATIC_DIR

__all__ = ["install_ui"]


def install_ui(app: FastAPI) -> None:
    """Mount the dashboard's pages, actions and static files on ``app``."""
    from .actions import router as actions_router
    from .pages import router as pages_router

    app.include_router(actions_router)
    app.include_router(pages_router)
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
