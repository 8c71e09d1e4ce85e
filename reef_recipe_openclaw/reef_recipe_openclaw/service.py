"""The recipe's place in a running server: records in, computed reports out.

When a server starts with ``recipe=openclaw`` (and a learning loop), the plugin's ``startup``
hook registers an ``OpenClawService`` on that kernel only. Its ``record_stored`` hook hands each
record to the event loop (never blocking the record writer), where the scenario's
``TurnProcessor`` takes it. A timer closes idle sessions. Servers with another recipe register
nothing, so their records cost nothing here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from reef_core import hookimpl

from .judge import build_judge

log = logging.getLogger("reef.openclaw")


class OpenClawService:
    """Per-kernel: one ``TurnProcessor`` per scenario whose recipe is an ``OpenClawRecipe``."""

    def __init__(self, reef: Any, recipe_type: type):
        self.reef = reef
        self.recipe_type = recipe_type
        self.processors: dict[str, Any] = {}
        self._not_mine: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.Task | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for scenario in self.reef.learning.configured_scenarios():
            self.processor(scenario)
        ttl = min((p.options.session_ttl_s for p in self.processors.values()), default=60.0)
        self._timer = asyncio.create_task(self._expire_every(max(min(ttl / 4, 30.0), 0.05)),
                                          name="reef-openclaw-sessions")

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
        for proc in self.processors.values():
            await proc.aclose()

    def processor(self, scenario: str) -> Any:
        """The scenario's processor, built on first use (None when its recipe is not OpenClaw)."""
        proc = self.processors.get(scenario)
        if proc is not None or scenario in self._not_mine:
            return proc
        try:
            recipe = self.reef.learning.plan(scenario).recipe
        except Exception:
            log.exception("openclaw: the plan of scenario %s could not be built; its traffic is not judged", scenario)
            self._not_mine.add(scenario)
            return None
        if not isinstance(recipe, self.recipe_type):  # a subclass of the contract is never wrapped
            self._not_mine.add(scenario)
            return None
        judge = build_judge(recipe.judge, runtime=self.reef.runtime, scenario=scenario)
        proc = recipe.processor(scenario, judge, self.store_report)
        self.processors[scenario] = proc
        return proc

    def store_report(self, scenario: str, references: list[str], **kwargs: Any) -> Any:
        return self.reef.store_report(scenario, references, **kwargs)

    # ------------------------------------------------------------------ hooks (this kernel only)

    @hookimpl
    def record_stored(self, record: Any) -> None:
        """May run in the record writer's thread: hand the record to the event loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._ingest, record)

    def _ingest(self, record: Any) -> None:
        try:
            proc = self.processor(record.scenario)
            if proc is not None:
                proc.ingest(record)
        except Exception:  # one bad record must not stop the others
            log.exception("openclaw: record %s could not be taken into a session", getattr(record, "id", "?"))

    async def _expire_every(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            now = time.time()
            for proc in list(self.processors.values()):
                proc.expire(now)

