"""Templates, the dashboard's error pages and the session checks every page goes through.

Dashboard routes use ``UiRoute``: an error raised anywhere in them (by the API's own route
functions the pages reuse, or by a bad query parameter) becomes an HTML page with the same
status the API would answer, never the API's JSON and never a stack trace.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import HTMLResponse, RedirectResponse, Response

from ..errors import ConfigError, ConflictError, NotFoundError
from ..serve.auth import check_role
from ..serve.errors import ClientError
from . import sessions
from .sessions import UiSession

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
#: the vendored htmx (``npm pack htmx.org@2``; its license beside it)
HTMX = "htmx-2.0.11.min.js"


def _when(value: Any) -> str:
    """A stored timestamp as ``YYYY-MM-DD HH:MM:SS UTC``."""
    if not value:
        return ""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.{digits}f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]),
                  trim_blocks=True, lstrip_blocks=True)
env.filters.update(when=_when, num=_num, pretty=_pretty, q=lambda s: quote(str(s), safe=""))
env.globals.update(htmx=HTMX)


class UiError(Exception):
    """An error page: ``status`` and a message for the person reading it."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class LoginRequired(Exception):
    """No session (auth on): a page redirects to the login form, an action answers 401."""


def _status_of(exc: Exception) -> tuple[int, str] | None:
    if isinstance(exc, UiError):
        return exc.status, str(exc)
    if isinstance(exc, StarletteHTTPException):  # FastAPI's and Starlette's own (a malformed form body)
        return exc.status_code, exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if isinstance(exc, ClientError):
        return exc.status, str(exc)
    if isinstance(exc, NotFoundError):
        return 404, str(exc)
    if isinstance(exc, ConflictError):
        return 409, str(exc)
    if isinstance(exc, ConfigError):
        return 400, str(exc)
    if isinstance(exc, RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("query", "body", "path"))
        return 422, f"{where}: {err.get('msg', 'invalid value')}" if where else "invalid request"
    return None


class UiRoute(APIRoute):
    """An ``APIRoute`` whose client errors render as dashboard pages."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except LoginRequired:
                if request.method == "GET":
                    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    fragment = request.headers.get("hx-request")
                    if fragment:  # a fragment's poll: back to the page it was polled from, not to the fragment
                        target = _page_of(request.headers.get("hx-current-url"), request) or "/ui"
                    url = f"/ui/login?next={quote(target, safe='')}"
                    if fragment:
                        return Response(status_code=200, headers={"HX-Redirect": url})
                    return RedirectResponse(url, status_code=303)
                return error_page(request, 401, "log in first: this server asks for a token")
            except Exception as exc:
                found = _status_of(exc)
                if found is None:
                    raise
                return error_page(request, *found)

        return route


def _page_of(url: str | None, request: Request) -> str | None:
    """The dashboard path (and query) of ``url``, an htmx request's ``HX-Current-URL``: only
    this server's own ``/ui`` pages (the login form's ``next`` is checked again there)."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.netloc and parts.netloc != request.headers.get("host"):
        return None
    if not (parts.path == "/ui" or parts.path.startswith("/ui/")):
        return None
    return parts.path + (f"?{parts.query}" if parts.query else "")


def page_session(request: Request) -> UiSession:
    """The session a page acts with; raises LoginRequired when there is none."""
    session = sessions.current(request)
    if session is None:
        raise LoginRequired()
    request.state.ui_session = session
    return session


def admin_session(request: Request, csrf: str | None) -> UiSession:
    """The session of an admin action: logged in, the ``admin`` role, the form's CSRF token."""
    session = page_session(request)
    check_role(session.principal, ("admin",))
    if not session.csrf_ok(csrf):
        raise UiError(403, "the form's security token is missing or stale: reload the page and try again")
    return session


def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    session: UiSession | None = getattr(request.state, "ui_session", None)
    principal = session.principal if session else None
    flash, partial = None, template.startswith("_")
    if session is not None and not partial:
        flash, session.flash = session.flash, None
    html = env.get_template(template).render(
        request=request, session=session, principal=principal, flash=flash,
        is_admin=bool(principal and principal.has_role("admin")),
        auth_on=sessions.auth_enabled(request), csrf=session.csrf if session else "", **context)
    response = HTMLResponse(html, status_code=status, headers={
        "cache-control": "no-store",
        # everything the pages load comes from this server; nothing from a CDN
        "content-security-policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                                   "frame-ancestors 'none'; form-action 'self'",
        "x-content-type-options": "nosniff",
        "referrer-policy": "same-origin",
    })
    new = getattr(request.state, "ui_new_session", None)
    if new is not None:
        sessions.set_cookie(request, response, new)
    return response


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    if getattr(request.state, "ui_session", None) is None:
        request.state.ui_session = sessions.sessions(request).get(request.cookies.get(sessions.COOKIE))
    if request.headers.get("hx-request"):
        # htmx swaps 2xx answers only: show the message where the action's result goes
        response = render(request, "_error.html", status=200, status_code=status, message=message)
        response.headers["HX-Reswap"] = "innerHTML"
        return response
    return render(request, "error.html", status=status, status_code=status, message=message)
