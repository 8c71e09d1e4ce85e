"""Browser sessions of the dashboard: a token exchanged once for an opaque session cookie.

The login form posts a token; it is checked against the same ``TokenTable`` the API uses
(``reef_core.serve.auth``) and never stored: the browser gets a random session id in an
``HttpOnly``, ``SameSite=Strict`` cookie without ``Max-Age`` (it ends with the browser
session), and the server maps that id to the token's ``Principal`` in memory. A restart
logs everyone out, which is the point: nothing about a token outlives the process.

Every session carries a CSRF token that admin forms echo back; ``SameSite=Strict`` already
keeps the cookie off cross-site requests, the form token covers browsers that ignore it.

With auth off (no token configured) there is no login: a session is opened on the first
page view for the anonymous admin, only to carry the CSRF token.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from fastapi import Request
from starlette.responses import Response

from ..serve.auth import ANONYMOUS_ADMIN, Principal, token_table

COOKIE = "reef_ui_session"
#: a session unused for this long is forgotten (the cookie itself ends with the browser session)
IDLE_TIMEOUT_S = 12 * 3600
#: at most this many sessions are kept; the least recently used one goes first
MAX_SESSIONS = 10_000


@dataclass
class UiSession:
    """One logged-in browser: who it acts as and the token its forms must send back."""

    id: str
    principal: Principal
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    last_used: float = field(default_factory=time.monotonic)
    #: what the last action did, shown once by the next page
    flash: str | None = None

    def csrf_ok(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(presented.encode(), self.csrf.encode())


class SessionStore:
    """Session id → ``UiSession``, in memory, bounded (LRU) and expiring when idle."""

    def __init__(self, idle_timeout_s: float = IDLE_TIMEOUT_S, max_sessions: int = MAX_SESSIONS):
        self.idle_timeout_s = idle_timeout_s
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, UiSession] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, principal: Principal) -> UiSession:
        session = UiSession(id=secrets.token_urlsafe(32), principal=principal)
        with self._lock:
            self._sessions[session.id] = session
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> UiSession | None:
        if not session_id:
            return None
        now = time.monotonic()
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            if now - session.last_used > self.idle_timeout_s:
                del self._sessions[session_id]
                return None
            session.last_used = now
            self._sessions.move_to_end(session_id)
            return session

    def close(self, session_id: str | None) -> None:
        with self._lock:
            self._sessions.pop(session_id or "", None)

    def __len__(self) -> int:
        return len(self._sessions)


def sessions(request: Request) -> SessionStore:
    """The app's session store (created with the app's first dashboard request)."""
    state = request.app.state
    store = getattr(state, "ui_sessions", None)
    if store is None:
        store = state.ui_sessions = SessionStore()
    return store


def auth_enabled(request: Request) -> bool:
    return token_table(request).enabled


def login(request: Request, token: str) -> UiSession | None:
    """A new session for ``token``'s principal, or None when the token is unknown."""
    principal = token_table(request).lookup(token.strip()) if token and token.strip() else None
    return sessions(request).open(principal) if principal is not None else None


def current(request: Request) -> UiSession | None:
    """The request's session: the cookie's, or (auth off) a new anonymous one that the
    response must set (``request.state.ui_new_session``). None: log in first."""
    session = sessions(request).get(request.cookies.get(COOKIE))
    if session is not None:
        return session
    if auth_enabled(request):
        return None
    session = sessions(request).open(ANONYMOUS_ADMIN)
    request.state.ui_new_session = session
    return session


def set_cookie(request: Request, response: Response, session: UiSession) -> None:
    """The session cookie: no ``Max-Age``/``Expires`` (a browser-session cookie), script-proof,
    never sent cross-site, ``Secure`` when the dashboard is reached over HTTPS."""
    secure = request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "").startswith("https")
    response.set_cookie(COOKIE, session.id, path="/ui", httponly=True, samesite="strict", secure=secure)


def clear_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
