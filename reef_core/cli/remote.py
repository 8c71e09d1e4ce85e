"""How ``reef grow``, ``reef rollback`` and ``reef releases`` reach a running server.

The server is, in this order: the one ``--url`` (or ``REEF_URL``) names; the one the
``served-config.json`` that ``common.load_served`` picks says runs (that of the server last
started in this directory when no config is given, else the configured state directory's),
when its process is alive on this machine and its URL answers ``/healthz``; otherwise none,
and the command acts on the state directory itself (``reef_core.served_config.check_given``
guards that). The token is ``--token`` (or
``REEF_TOKEN``), else an admin token of the configuration used.

Errors the server answers are printed with its own message. Exit codes: 2 when the caller
must change how it calls (401, 403 and other 4xx: a wrong token, role or request), 1 for the
rest (404 an unknown release or scenario, 409 a step already running, 5xx) — as the same
failures exit when acting locally; 2 as well for a server named that cannot be reached: the
command cannot do what was asked, and answering from another state could be a wrong empty
answer.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from ..errors import ReefError
from ..served_config import ServedConfig

#: how long finding a server may take: ``/healthz`` answers at once when it runs
PROBE_TIMEOUT_S = 5.0


class ServerError(ReefError):
    """The server refused a command or could not be reached; ``exit_code`` by status."""

    def __init__(self, message: str, *, status: int | None = None, body: Any = None, unreachable: bool = False):
        super().__init__(message)
        self.status = status
        self.body = body
        refused = status is not None and 400 <= status < 500 and status not in (404, 409)
        self.exit_code = 2 if refused or unreachable else 1


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        text = " ".join(response.text.split())[:300]
        return text or f"HTTP {response.status_code}"
    return _message_of(body) or f"HTTP {response.status_code}"


def _message_of(body: Any) -> str | None:
    """The error message of a JSON error body (``error.message``, or FastAPI's ``detail``)."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(body, dict) and body.get("detail"):
        return str(body["detail"])
    return None


class RemoteReef:
    """A running Reef server, by URL, with the routes the CLI uses."""

    def __init__(self, url: str, token: str | None, *, found_by: str, served: ServedConfig | None = None):
        self.url = url.rstrip("/")
        #: whether the command was given overrides or a config file (``common.say_via`` notes a difference then)
        self.config_given = True
        self.token = token
        #: how the server was found (``--url``, ``served-config.json``), for messages
        self.found_by = found_by
        #: the state directory's record of it, when found through it
        self.served = served

    @property
    def shown_url(self) -> str:
        """The URL for messages: a password in it masked."""
        from ..config import mask_url_text

        return mask_url_text(self.url)

    def _call(self, method: str, path: str, *, json: Any = None, read_timeout: float | None = 60,
              ok_statuses: tuple[int, ...] = ()) -> tuple[int, Any]:
        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            with httpx.Client(base_url=self.url, headers=headers,
                              timeout=httpx.Timeout(10.0, read=read_timeout)) as client:
                response = client.request(method, path, json=json)
        except httpx.HTTPError as exc:
            raise ServerError(f"cannot reach the Reef server at {self.shown_url} (from {self.found_by}): "
                              f"{type(exc).__name__}: {exc}", unreachable=True) from None
        if response.status_code >= 400 and response.status_code not in ok_statuses:
            raise ServerError(f"the server at {self.shown_url} answered {response.status_code}: {_message(response)}",
                              status=response.status_code)
        try:
            return response.status_code, response.json()
        except ValueError:
            raise ServerError(f"the server at {self.shown_url} answered {response.status_code} with a body that is "
                              "not JSON; is it a Reef server?", status=None) from None

    @staticmethod
    def _scenario(scenario: str) -> str:
        return quote(scenario, safe="")

    def _expect(self, body: Any, *keys: str) -> dict[str, Any]:
        """``body`` when it is an object with ``keys``; else the server is not answering as Reef does."""
        missing = [k for k in keys if not isinstance(body, dict) or k not in body]
        if missing:
            raise ServerError(f"the server at {self.shown_url} answered without {', '.join(repr(k) for k in missing)}; "
                              "is it a Reef server (of this version)?")
        return body

    def grow(self, scenario: str) -> dict[str, Any]:
        """Run one growth step on the server (it answers when the step is done): the step's
        result, ``outcome: busy`` when one is already running."""
        status, body = self._call("POST", f"/reef/scenarios/{self._scenario(scenario)}/grow", read_timeout=None,
                                  ok_statuses=(409,))
        if status == 409 and not (isinstance(body, dict) and body.get("outcome") == "busy"):
            raise ServerError(f"the server at {self.shown_url} answered 409: {_message_of(body)}", status=409)
        return self._expect(body, "outcome")

    def rollback(self, scenario: str, target: str) -> dict[str, Any]:
        """Roll back to ``target`` (a release id, or ``base``) on the server: its answer,
        ``{release, published, message}``."""
        _, body = self._call("POST", f"/reef/scenarios/{self._scenario(scenario)}/rollback",
                             json={"to": "base"} if target == "base" else {"release_id": target})
        return self._expect(body, "message")

    def releases(self, scenario: str) -> list[dict[str, Any]]:
        """The scenario's release chain, newest first."""
        _, body = self._call("GET", f"/reef/scenarios/{self._scenario(scenario)}/releases")
        return self._expect(body, "releases")["releases"]

    def mode(self, scenario: str) -> dict[str, Any]:
        """The scenario's learning mode: ``{scenario, mode, since, set_by}``."""
        return self._expect(self._call("GET", f"/reef/scenarios/{self._scenario(scenario)}/mode")[1], "scenario", "mode")

    def set_mode(self, scenario: str, mode: str, set_by: str | None = None) -> dict[str, Any]:
        """Set the scenario's learning mode on the server (admin), recorded as set by ``set_by``
        (the server's default: ``api``): ``{scenario, mode, since, set_by}``."""
        body = {"mode": mode, **({"set_by": set_by} if set_by else {})}
        return self._expect(self._call("PUT", f"/reef/scenarios/{self._scenario(scenario)}/mode", json=body)[1],
                            "scenario", "mode")

    def scenario_names(self) -> list[str]:
        """Every scenario the token may see, by name (all pages)."""
        names: list[str] = []
        cursor: str | None = None
        while True:
            query = f"?cursor={quote(cursor, safe='')}" if cursor else ""
            _, body = self._call("GET", f"/reef/scenarios{query}")
            names += [s["name"] for s in self._expect(body, "scenarios")["scenarios"] if isinstance(s, dict)]
            cursor = body.get("next_cursor")
            if not cursor:
                return names

    def scenario(self, scenario: str) -> dict[str, Any]:
        """``GET /reef/scenarios/{s}``: recipe, releases, counts, mode and the loop's state."""
        return self._call("GET", f"/reef/scenarios/{self._scenario(scenario)}")[1]

    def candidates(self, scenario: str, limit: int) -> list[dict[str, Any]]:
        """The scenario's newest ``limit`` candidates, newest first."""
        _, body = self._call("GET", f"/reef/scenarios/{self._scenario(scenario)}/candidates?limit={limit}")
        return self._expect(body, "candidates")["candidates"]


def _answers(url: str) -> bool:
    """Whether a Reef answers ``/healthz`` at ``url`` (200, or 503 naming a dead worker)."""
    try:
        response = httpx.get(f"{url.rstrip('/')}/healthz", timeout=PROBE_TIMEOUT_S)
        return response.status_code in (200, 503) and "ok" in response.json()
    except (httpx.HTTPError, ValueError, TypeError):
        return False


def find_server(settings: Any, *, url: str | None, token: str | None,
                served: ServedConfig | None = None) -> RemoteReef | None:
    """The running server the command goes to, or None to act on the state directory.

    ``served`` is the record to look at (``common.load_served`` picks it), else the state
    directory's. A server named by ``url`` is used as is: when it cannot be reached, the
    command says so (exit 2) rather than answer from some other state."""
    if token is None:
        token = next((t.token for t in settings.auth.tokens if t.role == "admin"), None)
    if url:
        return RemoteReef(url, token, found_by="--url / REEF_URL")
    if served is None:
        served = ServedConfig.read(settings.state_dir)
    if served is None or not served.server_alive():
        return None
    if not served.url or not _answers(served.url):
        # port 0 or a test server (no URL), or a process that is not it (a pid reused) or does
        # not answer yet: act on the state, which is safe next to a server (compare-and-swap,
        # consumption) and, with the served config, reads what the server would answer
        return None
    return RemoteReef(served.url, token, found_by=str(served.path), served=served)
