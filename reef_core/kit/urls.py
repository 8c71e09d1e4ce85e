"""Upstream URLs that may carry credentials: take them out, send them as Basic auth, log without them.

Error messages reach clients and records, so a runtime that talks to a model server over HTTP
names it in logs only, through ``redact_url``; ``user:password@`` written into a configured URL
becomes an ``Authorization: Basic`` header (what it means for HTTP, as in curl and httpx).
"""

from __future__ import annotations

import base64


def split_url_credentials(url: str, key: str = "runtime.upstream_url") -> tuple[str, tuple[str, str] | None]:
    """``url`` without its ``user:password@`` part, and that part (percent-decoded), if any.

    A URL that does not parse is a ValueError that names the config ``key`` but does not quote
    the URL: it may hold a password (httpx's own message for ``http://user:pa/ss@host`` quotes part of it)."""
    import httpx  # here, not at the top: the plugin kit is imported by every plugin's entry point

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise ValueError(f"{key} is not a valid URL (not shown here: it may contain credentials)") from None
    if not parsed.userinfo:
        return url, None
    return str(parsed.copy_with(username=None, password=None)), (parsed.username, parsed.password)


def redact_url(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, for log lines: no credentials, path or query."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return "<unparsable URL>"
    return f"{parsed.scheme}://{parsed.netloc.decode('ascii', 'replace')}"


def basic_auth(credentials: tuple[str, str]) -> str:
    """The ``Authorization`` header value for ``(user, password)``."""
    user, password = credentials
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


__all__ = ["basic_auth", "redact_url", "split_url_credentials"]
