"""Which scenarios exist: admission of scenario names named by requests.

Any client may name a scenario (``x-reef-scenario``), and every scenario costs something for
as long as it exists: a worker and release state in the learning loop, a line in
``GET /reef/scenarios``, a set of metric series. ``server.max_scenarios`` and
``server.scenarios_open`` bound that:

- *Pinned* scenarios always exist: the configured ones (``scenarios.<name>``), the default
  one and every scenario an auth token is limited to.
- ``scenarios_open: false``: only pinned scenarios exist; a request naming another gets 403.
- ``scenarios_open: true``: scenarios with stored data (records, reports or releases) exist as
  well, and a request may name a new one while fewer than ``max_scenarios`` exist. Past the
  cap a *new* name gets 403; existing scenarios keep working.

The registry lives in memory: one store query at start-up, then a set lookup per request.
Several processes sharing one database each keep their own registry, so the cap holds per
process (each admits at most ``max_scenarios``, counting what was stored when it started).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import threading
from collections.abc import Iterable
from typing import Any

from ..hookspecs import hookimpl
from .errors import ClientError

__all__ = ["SCENARIO_NAME", "ScenarioRegistry", "decode_name_cursor", "encode_name_cursor", "header_scenario",
           "is_scenario_name", "path_scenario", "pinned_scenarios", "scenario_name_problem"]

from ..names import SCENARIO_NAME, is_scenario_name, scenario_name_problem


def header_scenario(value: str | None, default: str) -> str:
    """The scenario a request names in ``x-reef-scenario`` (``default`` when absent or blank);
    a value that is no scenario name is the client's 400."""
    scenario = (value or "").strip()
    if not scenario:
        return default
    problem = scenario_name_problem(scenario)
    if problem:
        raise ClientError(f"x-reef-scenario {problem}", param="x-reef-scenario")
    return scenario


def path_scenario(scenario: str) -> str:
    """The scenario a route's path names; one that is no scenario name is a 404 before any lookup."""
    problem = scenario_name_problem(scenario)
    if problem:
        raise ClientError(problem, status=404)
    return scenario


#: longest cursor ``decode_name_cursor`` reads (a scenario name is at most 200 characters)
_MAX_NAME_CURSOR = 1200


def pinned_scenarios(settings: Any) -> frozenset[str]:
    """Scenarios that exist whatever the admission rules: configured, default, token-listed."""
    names = {settings.server.default_scenario, *settings.scenarios}
    for token in settings.auth.tokens:
        if token.scenarios:
            names.update(token.scenarios)
    return frozenset(names)


class ScenarioRegistry:
    """The scenarios this process serves, and the admission of new ones.

    ``admit`` is the hot-path call: a set lookup for a known name. Only a new name takes the
    lock, so concurrent first requests for new scenarios cannot together overshoot the cap.
    """

    def __init__(self, pinned: Iterable[str], *, max_scenarios: int, open: bool):
        self.pinned = frozenset(pinned)
        self.max_scenarios = max_scenarios
        self.open = open
        self._known: set[str] = set(self.pinned)
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Any) -> ScenarioRegistry:
        return cls(pinned_scenarios(settings), max_scenarios=settings.server.max_scenarios,
                   open=settings.server.scenarios_open)

    @hookimpl
    async def startup(self, reef: Any) -> None:
        """Load the scenarios with stored data (one store query; none when the registry is closed)."""
        if self.open:
            self.load(await asyncio.to_thread(reef.store.scenario_names))

    def load(self, stored: Iterable[str]) -> None:
        """Add the scenarios that have stored data (start-up). A closed registry ignores them:
        there, only pinned scenarios exist."""
        if not self.open:
            return
        with self._lock:
            self._known.update(stored)

    def __contains__(self, name: object) -> bool:
        return name in self._known

    def __len__(self) -> int:
        return len(self._known)

    def known(self) -> frozenset[str]:
        """A snapshot of the scenarios that exist now."""
        with self._lock:
            return frozenset(self._known)

    def admit(self, name: str, *, register: bool = True) -> None:
        """Let a request use scenario ``name`` or raise ClientError (403) naming the setting
        that refuses it. ``register=False`` checks without making a new name known (for
        requests that cannot create data in a new scenario, such as reports, whose receipts
        must belong to the scenario already)."""
        if name in self._known:
            return
        if not self.open:
            raise ClientError(f"scenario {name[:80]!r} does not exist: this server serves only its configured "
                              f"scenarios (server.scenarios_open is false)", 403, param="x-reef-scenario")
        with self._lock:
            if name in self._known:
                return
            if len(self._known) >= self.max_scenarios:
                raise ClientError(f"scenario {name[:80]!r} is new and this server already has "
                                  f"{len(self._known)} scenarios, its limit (server.max_scenarios); use an "
                                  f"existing scenario", 403, param="x-reef-scenario")
            if register:
                self._known.add(name)


def encode_name_cursor(name: str) -> str:
    """The cursor of a page of scenarios that ends with ``name`` (the next page starts after it)."""
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def decode_name_cursor(cursor: str) -> str:
    """The scenario name ``cursor`` ends a page with; ClientError (400) for anything else."""
    bad = ClientError("cursor: not a cursor this server issued (pass next_cursor back as is)", param="cursor")
    if not cursor or len(cursor) > _MAX_NAME_CURSOR:
        raise bad
    try:
        name = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, ValueError):
        raise bad from None
    if not name or encode_name_cursor(name) != cursor:  # exactly what encode_name_cursor writes
        raise bad
    return name
