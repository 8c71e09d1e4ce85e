"""Per-scenario learning modes for the learning loop (``docs/modes.md``).

- ``auto``: reports, the schedule, start-up and explicit grow all run growth steps;
- ``manual``: only an explicit grow (``POST /reef/scenarios/{s}/grow``, ``reef grow``);
- ``paused``: records and reports are stored and stay in the pool; nothing is learned;
- ``record_only``: a recording proxy; nothing is learned, and what is recorded in this mode
  never becomes experience (leaving it starts the pool afresh).

The configured mode (``scenarios.<name>.mode``) holds until one is set through the API, the
CLI or the dashboard; the stored one wins from then on, across restarts. Every answer here
reads the record store, so every process of a server (and the CLI beside it) agrees.
"""

from __future__ import annotations

import logging
from typing import Any

from ..config import LEARNING_MODES
from ..errors import ConfigError, ConflictError
from ..store.modes import CONFIG, mode_json

log = logging.getLogger("reef.loop")

#: modes in which nothing is learned, not even on an explicit grow
NOT_LEARNING = ("paused", "record_only")


class ScenarioModes:
    """The learning modes of one kernel's scenarios: configured, stored, and how they change."""

    def __init__(self, store: Any, settings: Any):
        self.store = store
        self.settings = settings

    def configured(self, scenario: str) -> str:
        sc = self.settings.scenarios.get(scenario)
        return sc.mode if sc is not None else "auto"

    def mode(self, scenario: str) -> str:
        """``scenario``'s mode now (blocking: one primary-key read)."""
        row = self.store.scenario_mode(scenario)
        return row.mode if row is not None else self.configured(scenario)

    def describe(self, scenario: str) -> dict[str, Any]:
        """``{"scenario", "mode", "since", "set_by"}``: ``since`` None when the mode was never
        stored, ``set_by`` None when it comes from the configuration."""
        row = self.store.scenario_mode(scenario)
        if row is None:
            return {"scenario": scenario, "mode": self.configured(scenario), "since": None, "set_by": None}
        return mode_json(row)

    def set(self, scenario: str, mode: str, by: str | None) -> dict[str, Any]:
        """Store ``mode`` for ``scenario`` (it wins over the configuration from now on)."""
        if mode not in LEARNING_MODES:
            raise ConfigError(f"unknown learning mode {mode!r}; use one of: {', '.join(LEARNING_MODES)}")
        row = self.store.set_scenario_mode(scenario, mode, set_by=by or "unknown",
                                           in_effect=self.configured(scenario))
        log.info("scenario %s: learning mode %s (set by %s)", scenario, mode, by or "unknown")
        return mode_json(row)

    def apply_configured(self) -> None:
        """Bring the stored configured modes in line with the configuration (blocking).

        A scenario whose mode was set through the API, the CLI or the dashboard keeps it. For
        the others the configured mode is stored (``set_by = "config"``) when it is not auto
        or was stored before, so a configuration that takes a scenario out of
        ``record_only`` across a restart starts its pool then, as a mode change would.
        """
        stored = self.store.scenario_modes()
        for scenario, sc in sorted(self.settings.scenarios.items()):
            row = stored.get(scenario)
            if row is not None and row.set_by != CONFIG:
                continue  # set explicitly: it wins over the configuration
            if (row is None and sc.mode == "auto") or (row is not None and row.mode == sc.mode):
                continue
            self.store.set_scenario_mode(scenario, sc.mode, set_by=CONFIG, in_effect="auto")

    def check_can_learn(self, scenario: str) -> None:
        """ConflictError (409) naming the mode and how to change it when ``scenario`` learns nothing."""
        mode = self.mode(scenario)
        if mode in NOT_LEARNING:
            raise ConflictError(
                f"scenario {scenario!r} is in learning mode {mode!r}, in which nothing is learned; "
                f"set the mode to manual or auto first: PUT /reef/scenarios/{scenario}/mode "
                f'{{"mode": "manual"}}, or reef mode {scenario} manual')
