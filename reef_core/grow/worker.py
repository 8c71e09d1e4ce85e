"""One asyncio worker per scenario: at most one growth step at a time, off the request path.

The worker sleeps until poked (a report was stored, the schedule fired, start-up), checks
whether the eligible batch is full and runs a step. ``grow_now`` runs a step on request;
while a step is running it answers ``busy`` instead of queueing behind it (an automatic
check that is only asking whether a batch is full is waited for: it takes milliseconds,
and a script that reports and then grows must not get ``busy`` because of it).

A step runs while this process holds the scenario's growth lease (``reef_core.grow.lease``);
while another process holds it, the step answers ``busy`` and an automatic trigger checks
again after ``loop.lease_poll_s`` seconds (sooner on PostgreSQL: a released lease is
announced). Holding the lease, the worker first catches the release chain up and settles the
scenario's candidates left by holdings that ended (a killed or fenced step), then runs the step
on the head it serves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .lease import Leases, settle_ended_steps
from .plan import ScenarioPlan
from .progress import LogProgress
from .step import StepResult, auto_step_due, run_step

if TYPE_CHECKING:
    from ..kernel import Reef

log = logging.getLogger("reef.grow")

#: how long a woken worker waits for more pokes before checking its scenario
COALESCE_S = 0.2
#: how long an explicit grow waits for a lease another server holds before answering busy
MANUAL_LEASE_WAIT_S = 2.0


class ScenarioWorker:
    """The growth worker of one scenario: runs steps of ``plan_of(scenario)`` on ``reef``."""

    def __init__(self, reef: Reef, scenario: str, plan_of: Callable[[str], ScenarioPlan], leases: Leases):
        self.reef = reef
        self.leases = leases
        self.plan_of = plan_of
        self.scenario = scenario
        self.lock = asyncio.Lock()
        self.last_step: StepResult | None = None
        self.steps = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._retry: asyncio.TimerHandle | None = None
        #: while an automatic trigger holds the lock only to check whether a step is due: set
        #: when the check has its answer (a step that is due then keeps the lock)
        self._checking: asyncio.Event | None = None
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
        if self._retry is not None:
            self._retry.cancel()
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
        """Run one step now (waits for a running one of this process to finish first; answers
        ``busy`` while another process holds the scenario's lease)."""
        # an explicit grow waits a moment: another server's automatic check that finds nothing
        # to learn holds the lease for a few milliseconds, and is no reason to answer busy
        wait_s = MANUAL_LEASE_WAIT_S if trigger == "manual" else 0.0
        async with self.lock:
            if trigger != "manual":
                checking = self._checking = asyncio.Event()
                try:
                    due = await asyncio.to_thread(auto_step_due, self.reef, self.plan_of(self.scenario))
                finally:
                    self._checking = None
                    checking.set()  # a waiting grow_now runs once this task has let go of the lock
                if not due:
                    return StepResult(scenario=self.scenario, trigger=trigger, outcome="nothing",
                                      reason="no full batch of eligible experience")
            return await self._step_leased(trigger, progress, wait_s)

    async def _step_leased(self, trigger: str, progress: Any, wait_s: float) -> StepResult:
        async with self.leases.hold(self.scenario, wait_s) as holding:
            if holding is None:
                self._check_later()
                result = StepResult(scenario=self.scenario, trigger=trigger, outcome="busy",
                                    reason="another server is running a growth step of this scenario")
                if trigger == "manual":
                    self.last_step = result
                return result
            releases, max_attempts = self.reef.releases, self.reef.settings.loop.max_attempts
            try:  # the chain first, then the candidates of ended holdings: reef_core.grow.lease
                orphans, interrupted = await asyncio.to_thread(settle_ended_steps, releases.chain, self.reef.store,
                                                               self.scenario, holding.token, max_attempts)
            except Exception as exc:  # nothing consumed: a later trigger tries again
                log.exception("%s: catching up the release chain failed", self.scenario)
                result = StepResult(scenario=self.scenario, trigger=trigger, outcome="error",
                                    reason=f"the release chain could not be caught up, so nothing was consumed "
                                           f"({type(exc).__name__}: {exc})")
                self.last_step = result
                return result
            try:
                await releases.serve_head(self.scenario)
            except Exception:  # the follower retries serving it; the step builds on the head all the same
                log.exception("%s: serving the head release failed", self.scenario)
            if orphans:
                log.warning("%s: settled %d candidate(s) of ended growth leases (%d interrupted)",
                            self.scenario, len(orphans), len(interrupted))
            progress = progress or LogProgress(logging.getLogger("reef.progress"), label=self.scenario)
            result = await run_step(self.reef, self.plan_of(self.scenario), trigger, progress, lease=holding)
            if result.outcome != "nothing" or trigger == "manual":
                self.last_step = result
                self.steps += 1
                log.info("%s: %s step → %s%s", self.scenario, trigger, result.outcome,
                         f" ({result.reason})" if result.reason else "")
            return result

    @property
    def waiting(self) -> bool:
        """Whether a trigger waits for another process's lease (a check is scheduled)."""
        retry = self._retry
        return retry is not None and not retry.cancelled() and retry.when() > asyncio.get_running_loop().time()

    def _check_later(self) -> None:
        """Poke this worker once ``loop.lease_poll_s`` seconds from now (one pending at most)."""
        if not self.waiting:
            self._retry = asyncio.get_running_loop().call_later(self.reef.settings.loop.lease_poll_s, self.poke)

    def lease_released(self) -> None:
        """Another process released the scenario's lease: a waiting trigger checks now (a
        worker nothing waits in stays asleep, so releases never wake every process)."""
        if self.waiting:
            self._retry.cancel()
            self.poke()

    async def grow_now(self, progress: Any = None) -> StepResult:
        """Run a step on request, or answer ``busy`` while one is running."""
        checking = self._checking
        if checking is not None:  # an automatic check: wait for its answer
            await checking.wait()
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
