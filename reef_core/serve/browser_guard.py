"""What a web browser may ask of Reef, checked before anything else runs.

With no token configured (the default on loopback) every request acts as an admin, and the
operator's browser is a client that runs code from any page it visits. Two checks keep those
pages out, for every route (the inference fast path included) at the cost of one pass over
the request's headers:

- **Host** (:mod:`.hosts`): only the server's own names are served, so that a page on another
  domain cannot reach Reef by DNS rebinding; 421 otherwise (400 for a malformed ``Host``). A
  request without ``Host`` (an HTTP/1.0 health probe) passes: browsers always send one.
- **Cross-site requests.** An HTML form on any page can POST to
  ``/reef/scenarios/{s}/grow``, ``/reef/report`` or, with a ``text/plain`` body that parses as
  JSON, ``/v1/chat/completions``. A request with a method other than GET, HEAD or OPTIONS is
  refused (403) when the browser says another site sent it: ``Sec-Fetch-Site`` other than
  ``same-origin`` or ``none`` (``same-site`` passes only with an ``Origin`` that is the
  request's own host), or, from browsers that do not send ``Sec-Fetch-Site``, an ``Origin``
  whose host is not the request's ``Host``. Pages cannot set either header themselves;
  clients that are not browsers (SDKs, curl, the CLI, agent hooks) send neither and pass.
  This is the rule of Go's ``net/http.CrossOriginProtection``. The dashboard's forms carry a
  CSRF token as well (``reef_core.ui.sessions``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.types import Scope, Send

from . import jsonfast
from .errors import dialect_of, error_body
from .hosts import AllowedHosts

log = logging.getLogger("reef.serve")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: ``Sec-Fetch-Site`` values of requests a page of this very server (or the user) started
_OWN_SITE = (b"same-origin", b"none")
#: seconds between two warnings about refused requests of one kind
_WARNING_INTERVAL_S = 60.0
_ERROR_TYPES = {400: "bad_request", 403: "cross_site_request", 421: "unknown_host"}


def same_origin(origin: bytes, host: bytes | None) -> bool:
    """Whether ``Origin`` (``scheme://host[:port]``) names the host the request was sent to."""
    scheme, sep, authority = origin.partition(b"://")
    return bool(sep) and host is not None and scheme in (b"http", b"https") and authority.lower() == host.lower()


def cross_site_refusal(host: bytes | None, origin: bytes | None, site: bytes | None) -> str | None:
    """Why a state-changing request is refused as cross-site, or None when it may proceed
    (the rule in the module docstring)."""
    if site is not None:
        if site in _OWN_SITE or (site == b"same-site" and origin is not None and same_origin(origin, host)):
            return None
        said = f"Sec-Fetch-Site: {site.decode('latin-1')[:40]}"
    elif origin is None or same_origin(origin, host):
        return None
    else:
        said = "an Origin other than this server"
    if origin is not None:
        said += f", Origin: {origin.decode('latin-1')[:200]}"
    return (f"refused a cross-site request: the browser says a page of another site sent it ({said}). "
            f"Only this server's own pages may change anything here from a browser; clients that are "
            f"not browsers send neither Origin nor Sec-Fetch-Site")


class BrowserGuard:
    """The Host and cross-site checks of one app (``ReefApp.guard``)."""

    def __init__(self, hosts: AllowedHosts, on_refusal: Callable[[int], None] | None = None):
        self.hosts = hosts
        #: called with the status of every refusal (the app's error counter)
        self.on_refusal = on_refusal
        self._warned: dict[int, tuple[float, int]] = {}

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """``(status, message)`` when the request must be refused, else None."""
        host = origin = site = None
        hosts = 0
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
                hosts += 1
            elif name == b"origin":
                origin = value
            elif name == b"sec-fetch-site":
                site = value
        if hosts > 1:
            return 400, "the request has more than one Host header"
        if host is not None:
            refused = self.hosts.check(host)
            if refused is not None:
                return refused
        if (origin is not None or site is not None) and scope["method"] not in SAFE_METHODS:
            reason = cross_site_refusal(host, origin, site)
            if reason is not None:
                return 403, reason
        return None

    async def refuse(self, scope: Scope, send: Send, status: int, message: str) -> None:
        """Answer ``status`` in the route's error shape (Reef's, or the provider's on ``/v1``)."""
        self._warn(status, message)
        if self.on_refusal is not None:
            self.on_refusal(status)
        dialect = dialect_of(Request(scope))
        body = jsonfast.dumps(error_body(dialect, status, message,
                                         error_type=_ERROR_TYPES.get(status) if dialect == "reef" else None))
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    def _warn(self, status: int, message: str) -> None:
        """A warning in the server log at most once a minute per status, with the count since."""
        now = time.monotonic()
        last, count = self._warned.get(status, (float("-inf"), 0))
        if now - last < _WARNING_INTERVAL_S:
            self._warned[status] = (last, count + 1)
            return
        self._warned[status] = (now, 0)
        more = f" ({count} more since the last warning)" if count else ""
        log.warning("HTTP %d%s: %s", status, more, message)
