"""Logging in and out, and the admin actions: grow now, roll back, set the learning mode.

Actions take form posts carrying the session's CSRF token and need the ``admin`` role (the
API's own check); the scenario limits are the API's too. They are sent by htmx (``hx-post``
with ``hx-confirm``: the browser asks before anything changes); without scripts the form
posts the same fields and the answer redirects back to the scenario's page.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Form, Request
from fastapi.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, RedirectResponse, Response

from ..config import LEARNING_MODES
from ..serve import routes_learning
from ..serve.routes_learning import RollbackIn
from . import sessions
from .progress import growth_view, start_growth
from .rendering import UiError, UiRoute, admin_session, page_session, render

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)


def _safe_next(target: str | None) -> str:
    """Where to go after logging in: a path of the dashboard only (never another site)."""
    if target and target.startswith("/ui") and not target.startswith("//") and "\\" not in target:
        return target
    return "/ui"


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, next: str | None = None) -> Response:  # noqa: A002 - the query's name
    if not sessions.auth_enabled(request):
        return RedirectResponse(_safe_next(next), status_code=303)
    return render(request, "login.html", next=_safe_next(next), failed=False)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, token: str = Form("", max_length=4096),
                next: str = Form("/ui", max_length=2048)) -> Response:  # noqa: A002
    """Exchange a token for a session cookie (the token itself is never stored or sent back)."""
    if not sessions.auth_enabled(request):
        return RedirectResponse(_safe_next(next), status_code=303)
    session = sessions.login(request, token)
    if session is None:
        return render(request, "login.html", status=401, next=_safe_next(next), failed=True)
    response = RedirectResponse(_safe_next(next), status_code=303)
    sessions.set_cookie(request, response, session)
    return response


@router.post("/logout")
async def logout(request: Request, csrf: str = Form("", max_length=200)) -> Response:
    session = page_session(request)
    if not session.csrf_ok(csrf):
        raise UiError(403, "the form's security token is missing or stale: reload the page and try again")
    sessions.sessions(request).close(session.id)
    response = RedirectResponse("/ui/login" if sessions.auth_enabled(request) else "/ui", status_code=303)
    sessions.clear_cookie(response)
    return response


def _back(request: Request, scenario: str) -> Response:
    """After an action: htmx reloads the scenario's page, a plain form post is redirected there."""
    url = f"/ui/scenarios/{quote(scenario, safe='')}"
    if request.headers.get("hx-request"):
        return Response(status_code=200, headers={"HX-Redirect": url})
    return RedirectResponse(url, status_code=303)


def _progress_panel(request: Request, scenario: str, *, watching: bool) -> Response:
    loop = request.app.state.reef.learning
    worker = loop.workers.get(scenario) if loop is not None else None
    view = growth_view(request, scenario, worker.status() if worker else None)
    if watching and not view["running"] and request.headers.get("hx-request"):
        # the step that was being watched has ended: reload the page (new candidate, release)
        return Response(status_code=200, headers={"HX-Refresh": "true"})
    return render(request, "_progress.html", scenario=scenario, growth=view)


@router.post("/scenarios/{scenario}/grow")
async def grow(scenario: str, request: Request, csrf: str = Form("", max_length=200)) -> Response:
    """Start a growth step now; the page follows its progress."""
    principal = admin_session(request, csrf).principal
    routes_learning._scenario(scenario, principal)
    await run_in_threadpool(routes_learning._known, request, scenario)
    loop = routes_learning._learning(request)
    # refused up front (409, the API's message) in a mode that learns nothing
    await run_in_threadpool(loop.modes.check_can_learn, scenario)
    start_growth(request, loop, scenario)
    if request.headers.get("hx-request"):
        return _progress_panel(request, scenario, watching=False)
    return _back(request, scenario)


@router.get("/scenarios/{scenario}/progress", response_class=HTMLResponse)
async def progress(scenario: str, request: Request, watching: bool = False) -> Response:
    """The progress panel (polled about every second while a step runs)."""
    principal = page_session(request).principal
    routes_learning._scenario(scenario, principal)
    return _progress_panel(request, scenario, watching=watching)


@router.post("/scenarios/{scenario}/rollback")
async def rollback(scenario: str, request: Request, release_id: str = Form(..., min_length=1, max_length=100),
                   csrf: str = Form("", max_length=200)) -> Response:
    """Serve an earlier release again (published as a new release, the API's rollback)."""
    session = admin_session(request, csrf)
    done = await routes_learning.rollback(scenario, RollbackIn(release_id=release_id), request,
                                          principal=session.principal)
    release = done.get("release")
    session.flash = done.get("message") or (
        f"Rolled back: release #{release['sequence']} serves the content of {release_id}" if release else None)
    return _back(request, scenario)


@router.post("/scenarios/{scenario}/mode")
async def set_mode(scenario: str, request: Request, mode: str = Form(..., max_length=40),
                   csrf: str = Form("", max_length=200)) -> Response:
    """Set the scenario's learning mode (stored, as ``PUT /reef/scenarios/{s}/mode`` does; the
    change is recorded as made from the dashboard)."""
    session = admin_session(request, csrf)
    routes_learning._scenario(scenario, session.principal)
    if mode not in LEARNING_MODES:
        raise UiError(422, f"mode: expected one of {', '.join(LEARNING_MODES)}, not {mode!r}")
    loop = routes_learning._learning(request)

    def write() -> dict:
        routes_learning._known(request, scenario)
        return loop.set_mode(scenario, mode, by="dashboard")

    info = await run_in_threadpool(write)
    session.flash = f"Learning mode of {scenario} set to {info['mode']}"
    return _back(request, scenario)
