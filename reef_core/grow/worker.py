"""One asyncio worker per scenario: at most one growth step at a time, off the request path.

The worker sleeps until poked (a report was stored, the schedule fired, start-up), checks
whether the eligible batch is full and runs a step. ``grow_now`` runs a step on request;
while a step is running it answers ``busy`` instead of queueing behind it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .plan import ScenarioPlan
from .progress import LogProgress
from .step import StepResult, run_step

if TYPE_CHECKING:
    from ..kernel import Reef

log = logging.getLogger("reef.grow")

#: how long a woken worker waits for more pokes before checking its scenario
COALESCE_S = 0.2


class ScenarioWorker:
    """The growth worker of one scenario: runs steps of ``plan_of(scenario)`` on ``reef``."""

    def __init__(self, reef: Reef, scenario: str, plan_of: Callable[[str], ScenarioPlan]):
        self.reef = reef
        self.plan_of = plan_of
        self.scenario = scenario
        self.lock = asyncio.Lock()
        self.last_step: StepResult | None = None
        self.steps = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        #: asked before each automatic step (the scenario's learning mode); None: always allowed
        self.may_grow_auto: Callable[[], Awaitable[bool]] | None = None

    @property
    def state(self) -> str:
        return "running" if self.lock.locked() else "idle"

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"reef-grow-{self.scenario}")

    @property
    def died(self) -> bool:
        """The worker's task ended by itself (it only ends when stopped): growth of this
        scenario has stopped, which ``/healthz`` reports so the process gets restarted."""
        return self._task is not None and self._task.done()

    def poke(self) -> None:
        """Ask the worker to check its scenario soon (cheap; coalesces)."""
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)  # stopping regardless of how it ends
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(COALESCE_S)  # a burst of reports makes one eligibility check
            self._wake.clear()
            if self.lock.locked():
                continue
            try:
                if self.may_grow_auto is not None and not await self.may_grow_auto():
                    continue
                result = await self.step("auto")
            except asyncio.CancelledError:
                raise
            except Exception:  # the worker must outlive one bad step
                log.exception("growth step of %s failed", self.scenario)
                continue
            if result.made_progress:
                self._wake.set()  # the pool may hold another full batch

    async def step(self, trigger: str, progress: Any = None) -> StepResult:
        """Run one step now (waits for a running one to finish first)."""
        async with self.lock:
            progress = progress or LogProgress(logging.getLogger("reef.progress"), label=self.scenario)
            result = await run_step(self.reef, self.plan_of(self.scenario), trigger, progress)
            if result.outcome != "nothing" or trigger == "manual":
                self.last_step = result
                self.steps += 1
                log.info("%s: %s step → %s%s", self.scenario, trigger, result.outcome,
                         f" ({result.reason})" if result.reason else "")
            return result

    async def grow_now(self, progress: Any = None) -> StepResult:
        """Run a step on request, or answer ``busy`` while one is running."""
        if self.lock.locked():
            return StepResult(scenario=self.scenario, trigger="manual", outcome="busy",
                              reason="a growth step is already running for this scenario")
        return await self.step("manual", progress)

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "steps": self.steps,
            "last_step": self.last_step.to_dict() if self.last_step else None,
        }
