"""Bearer-token auth: roles, scenario limits, and the FastAPI dependencies routes use.

Tokens come from ``reef.settings.auth.tokens`` (``REEF_TOKEN`` is already appended there as
an admin token). Only their SHA-256 digests are kept in memory; a presented token is hashed
and compared against every stored digest with ``hmac.compare_digest``, so the time taken
says nothing about which token (or which prefix) matched.

Roles:

- ``infer``  — the inference routes (``/v1/...``);
- ``report`` — ``POST /reef/report``;
- ``admin``  — everything, including rollback, grow and config changes.

Any valid token may use the read routes (``GET /reef/...``), limited to its scenarios. A
token may be limited to scenarios (``scenarios: [a, b]``; ``null`` means all).

With no token configured auth is off: every request acts as an anonymous admin (the runner
binds loopback only in that case, and says so).

Usage in a route::

    from reef_core.serve.auth import Principal, check_scenario, require_role

    @router.post("/reef/scenarios/{scenario}/grow")
    async def grow(scenario: str, principal: Principal = Depends(require_role("admin"))):
        check_scenario(principal, scenario)
        ...

401 means no or an unknown token; 403 means a valid token with the wrong role or outside its
scenarios. Both are raised as ``fastapi.HTTPException``; the app's error handlers render them
in the route's error shape (OpenAI, Anthropic or Reef JSON).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request

__all__ = [
    "ROLES",
    "Principal",
    "TokenTable",
    "authenticate",
    "check_scenario",
    "require_role",
    "token_table",
]

ROLES = ("infer", "report", "admin")

_WWW_AUTH = {"WWW-Authenticate": "Bearer"}


@dataclass(frozen=True)
class Principal:
    """Who is calling: a role and the scenarios the token may touch (None = all)."""

    role: str
    scenarios: frozenset[str] | None = None
    #: True when auth is off (no token configured)
    anonymous: bool = False

    def allows(self, scenario: str) -> bool:
        """Whether this principal may act on ``scenario``."""
        return self.scenarios is None or scenario in self.scenarios

    def has_role(self, *roles: str) -> bool:
        """Whether this principal holds one of ``roles`` (admin holds every role)."""
        return self.role == "admin" or self.role in roles


ANONYMOUS_ADMIN = Principal(role="admin", scenarios=None, anonymous=True)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class TokenTable:
    """The configured tokens as (SHA-256 digest, principal) pairs."""

    def __init__(self, tokens: Iterable[Any]):
        entries: list[tuple[bytes, Principal]] = []
        for t in tokens:
            token = t["token"] if isinstance(t, dict) else t.token
            role = t["role"] if isinstance(t, dict) else t.role
            scenarios = t.get("scenarios") if isinstance(t, dict) else t.scenarios
            if role not in ROLES:
                raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
            limit = None if scenarios is None else frozenset(scenarios)
            entries.append((_digest(token), Principal(role=role, scenarios=limit)))
        self._entries = tuple(entries)

    @property
    def enabled(self) -> bool:
        """Auth is on when at least one token is configured."""
        return bool(self._entries)

    def lookup(self, token: str) -> Principal | None:
        """The principal of ``token``, or None. Compares against every digest (constant time)."""
        presented = _digest(token)
        found: Principal | None = None
        for digest, principal in self._entries:
            if hmac.compare_digest(presented, digest) and found is None:
                found = principal
        return found


def token_table(request: Request) -> TokenTable:
    """The app's token table, built once from ``app.state.reef.settings`` and cached."""
    state = request.app.state
    table = getattr(state, "token_table", None)
    if table is None:
        table = TokenTable(state.reef.settings.auth.tokens)
        state.token_table = table
    return table


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    # Anthropic SDK clients send their key as ``x-api-key``; accept it the same way.
    key = request.headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def authenticate(request: Request) -> Principal:
    """The caller's principal; raises 401 when auth is on and the token is missing or unknown."""
    cached = getattr(request.state, "principal", None)
    if cached is not None:
        return cached
    table = token_table(request)
    if not table.enabled:
        principal = ANONYMOUS_ADMIN
    else:
        token = _bearer(request)
        if token is None:
            raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <token>'",
                                headers=_WWW_AUTH)
        found = table.lookup(token)
        if found is None:
            raise HTTPException(401, "invalid token: it matches no configured auth token",
                                headers=_WWW_AUTH)
        principal = found
    request.state.principal = principal
    return principal


def require_role(*roles: str) -> Callable[[Request], Awaitable[Principal]]:
    """A FastAPI dependency that authenticates and checks the role; returns the Principal.

    ``admin`` always passes. With no roles given, any valid token passes (read routes).
    The dependency is ``async`` on purpose: FastAPI runs plain ``def`` dependencies in a
    thread pool, a thread hand-off per request for a few microseconds of hashing.
    """
    for r in roles:
        if r not in ROLES:
            raise ValueError(f"unknown role {r!r}; expected one of {', '.join(ROLES)}")

    async def dependency(request: Request) -> Principal:
        principal = authenticate(request)
        check_role(principal, roles)
        return principal

    dependency.__name__ = f"require_role_{'_'.join(roles) or 'any'}"
    return dependency


def check_role(principal: Principal, roles: tuple[str, ...]) -> None:
    """403 unless ``principal`` has one of ``roles`` (admin always does; no roles: any token)."""
    if roles and not principal.has_role(*roles):
        need = " or ".join(repr(r) for r in roles) + ("" if "admin" in roles else " (or 'admin')")
        raise HTTPException(403, f"this token has role {principal.role!r}; this route needs {need}")


def check_scenario(principal: Principal, scenario: str) -> None:
    """Raise 403 when ``principal`` is limited to scenarios that do not include ``scenario``."""
    if not principal.allows(scenario):
        raise HTTPException(403, f"this token is not allowed to use scenario {scenario!r}")
