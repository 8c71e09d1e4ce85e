"""The learning loop of a running kernel: per-scenario plans, workers and triggers.

``LearningLoop`` is an in-process plugin: ``reef_core.compose.build_reef`` builds it and
registers it on the kernel (``reef.register``), which also sets ``reef.learning``. Its hooks:

- ``startup``: settle candidates a previous process left unsettled, of the scenarios whose
  growth lease this process can take (``reef_core.grow.lease``: other live servers' steps
  are left alone; their experience returns to the pool under the return rule), then (unless
  the kernel is one-shot) wake the scenarios with something to learn, start the schedule and
  retention (now, then hourly);
- ``report_stored``: a stored report wakes its scenario's worker;
- ``release_published``: a new release wakes its scenario (returned experience may be back);
- ``shutdown``: stop the schedule, retention and the workers.

Serving releases is not the loop's business: it hands published candidates to the kernel's
``reef.releases`` (``reef_core.commit.serving``), which serves, follows and rolls back
without it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from ..hookspecs import hookimpl
from ..observe import eligible
from ..observe.eligibility import pool_rule
from .lease import LeaseListener, Leases, settle_ended_steps
from .modes import ScenarioModes
from .plan import ScenarioPlan, resolve_plan
from .step import StepResult
from .worker import ScenarioWorker

if TYPE_CHECKING:
    from ..kernel import Reef

log = logging.getLogger("reef.loop")

#: the scenario status counts eligible experience up to this many (a bound on its cost)
STATUS_COUNT_CAP = 1000
_INTERRUPTED = ("proposed", "evaluating", "selected")
#: retention runs at start-up and then at most once per this many seconds
RETENTION_EVERY_S = 3600.0
#: seconds after start-up before retention's first run: the start itself stays quick
RETENTION_START_DELAY_S = 10.0
_RETENTION_FILE = "retention.json"


class LearningLoop:
    """Observe → Grow → Commit for every scenario of one kernel."""

    def __init__(self, reef: Reef):
        self.reef = reef
        self.store = reef.store
        self.settings = reef.settings
        self.workers: dict[str, ScenarioWorker] = {}
        self._plans: dict[str, ScenarioPlan] = {}
        #: scenario → its recipe's ``top_logprobs`` (read on the request path: a dict lookup)
        self._top_logprobs: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        #: this process's growth leases: one step per scenario across every server on the store
        self.leases = Leases(reef.store, self.settings.loop.lease_ttl_s)
        self._listener: LeaseListener | None = None
        #: what retention removed per scenario since this process started, and when it last ran
        self._removed: dict[str, dict[str, int]] = {}
        self._retention_last_run: str | None = None
        self._retention_last_ts = 0.0
        for scenario in self.configured_scenarios():  # a configuration error stops the start here
            self.plan(scenario)
        #: the scenarios' learning modes (``reef_core.grow.modes``), configured ones stored now
        self.modes = ScenarioModes(self.store, self.settings)
        self.modes.apply_configured()

    @property
    def background(self) -> bool:
        """Whether workers and the schedule run (False in one-shot kernels: the CLI)."""
        return self.reef.background

    # ------------------------------------------------------------------ configuration

    def configured_scenarios(self) -> list[str]:
        return sorted({self.settings.server.default_scenario, *self.settings.scenarios})

    def plan(self, scenario: str) -> ScenarioPlan:
        """``scenario``'s recipe, filters and evaluator, resolved once (``reef_core.grow.plan``)."""
        plan = self._plans.get(scenario)
        if plan is None:
            plan = self._plans[scenario] = resolve_plan(self.reef, scenario)
        return plan

    def top_logprobs(self, scenario: str) -> int:
        """What ``scenario``'s recipe asks the runtime to record per response token
        (``Recipe.top_logprobs``), resolved once per scenario; 0 when its plan cannot be built
        (the growth step reports that error)."""
        k = self._top_logprobs.get(scenario)
        if k is None:
            try:
                k = max(int(self.plan(scenario).recipe.top_logprobs or 0), 0)
            except Exception:
                log.exception("could not resolve the recipe of scenario %s; its traffic records no top logprobs",
                              scenario)
                k = 0
            self._top_logprobs[scenario] = k
        return k

    # ------------------------------------------------------------------ hooks

    @hookimpl
    async def startup(self, reef: Reef) -> None:
        """Settle interrupted candidates, start retention, then wake the scenarios with pending
        experience and start the schedule (the kernel's releases are recovered and served
        before this runs). Retention runs with the automatic triggers off too, never in a
        one-shot kernel."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._settle_interrupted)
        if not self.background:
            return
        if self.retention_configured:
            self._tasks.append(asyncio.create_task(self._retention_schedule(), name="reef-retention"))
        if not self.settings.loop.enabled:
            return
        if self.store.dialect == "postgresql":  # a lease released elsewhere wakes the scenario here
            self._listener = LeaseListener(self.store.url, self._lease_released_soon)
            self._listener.start()
        for scenario in await asyncio.to_thread(self._scenarios_to_check):
            self.poke(scenario)
        if self.settings.loop.schedule_s:
            self._tasks.append(asyncio.create_task(self._schedule(self.settings.loop.schedule_s),
                                                   name="reef-grow-schedule"))

    @hookimpl
    async def shutdown(self, reef: Reef) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # stopping regardless of how they end
        self._tasks.clear()
        if self._listener is not None:
            await asyncio.to_thread(self._listener.stop)
            self._listener = None
        for worker in list(self.workers.values()):
            await worker.stop()

    @hookimpl
    def report_stored(self, report: Any) -> None:
        """A stored report wakes its scenario: may run in any thread, never blocks."""
        self._poke_soon(report.scenario)

    @hookimpl
    def release_published(self, release: Any) -> None:
        """A new release wakes its scenario: experience returned while the old one served is
        back in the pool (the return rule's first condition)."""
        self._poke_soon(release.scenario)

    def _poke_soon(self, scenario: str) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.poke, scenario)

    def _lease_released_soon(self, scenario: str) -> None:
        """Another process released ``scenario``'s growth lease (any thread): a trigger waiting
        here for it checks now."""
        loop = self._loop
        worker = self.workers.get(scenario)
        if worker is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(worker.lease_released)

    # ------------------------------------------------------------------ triggers

    def worker(self, scenario: str) -> ScenarioWorker:
        worker = self.workers.get(scenario)
        if worker is None:
            worker = self.workers[scenario] = ScenarioWorker(self.reef, scenario, self.plan, self.leases)
            worker.may_grow_auto = functools.partial(self._grows_automatically, scenario)
        return worker

    async def _grows_automatically(self, scenario: str) -> bool:
        return await asyncio.to_thread(self.modes.mode, scenario) == "auto"

    def mode(self, scenario: str) -> str:
        """``scenario``'s learning mode (blocking: reads the store; ``reef_core.grow.modes``)."""
        return self.modes.mode(scenario)

    def set_mode(self, scenario: str, mode: str, by: str | None = None) -> dict[str, Any]:
        """Store ``scenario``'s learning mode; {"scenario", "mode", "since", "set_by"} (blocking).
        Becoming ``auto`` wakes the scenario's worker."""
        info = self.modes.set(scenario, mode, by)
        if mode == "auto":
            self._poke_soon(scenario)
        return info

    def poke(self, scenario: str) -> None:
        """Wake ``scenario``'s worker (event-loop thread only)."""
        if not (self.background and self.settings.loop.enabled):
            return
        worker = self.worker(scenario)
        worker.start()
        worker.poke()

    async def grow(self, scenario: str, progress: Any = None) -> StepResult:
        """Run a growth step of ``scenario`` now (``POST .../grow``, ``reef grow``); ConflictError
        in a mode that learns nothing (paused, record_only)."""
        await asyncio.to_thread(self.modes.check_can_learn, scenario)
        return await self.worker(scenario).grow_now(progress)

    def dead_tasks(self) -> list[str]:
        """Names of background tasks (schedule, growth workers) that ended while the loop runs:
        each catches its own step's errors, so one that ended is broken for good."""
        dead = [t.get_name() for t in self._tasks if t.done()]
        dead += [f"reef-grow-{name}" for name, w in list(self.workers.items()) if w.died]
        return dead

    def status(self, scenario: str) -> dict[str, Any]:
        """Loop state for ``GET /reef/scenarios/{s}`` (blocking: reads the store)."""
        plan = self.plan(scenario)
        serving = self.reef.serving_release(scenario)
        worker = self.workers.get(scenario)
        pending = 0
        if plan.recipe.update_target != "none":
            pending = len(eligible(self.store, scenario, list(plan.filters), want=STATUS_COUNT_CAP,
                                   rule=pool_rule(self.settings.loop, plan.recipe.batch_size)))
        removed = self._removed.get(scenario, {})
        mode = self.modes.describe(scenario)
        return {
            **plan.describe(),
            "mode": mode["mode"], "mode_since": mode["since"], "mode_set_by": mode["set_by"],
            "loop_enabled": self.settings.loop.enabled,
            "serving_release_id": serving.release_id if serving else None,
            "eligible": pending,
            **(worker.status() if worker else {"state": "idle", "steps": 0, "last_step": None}),
            "retention": {"last_run": self._retention_last_run,
                          **{f"removed_{k}": removed.get(k, 0) for k in ("reports", "records", "episodes")}},
        }

    # ------------------------------------------------------------------ retention

    @property
    def retention_configured(self) -> bool:
        r = self.settings.loop.retention
        return any(v is not None for v in (r.episodes_days, r.max_age_days, r.max_reports))

    def run_retention(self, now: datetime | None = None) -> dict[str, dict[str, int]]:
        """Remove what ``loop.retention`` says may go, in every scenario; {scenario: {"reports",
        "records", "episodes": removed}} of the scenarios that lost something (blocking)."""
        r = self.settings.loop.retention
        now = now or datetime.now(timezone.utc)
        self._retention_last_run = now.isoformat()
        self._remember_run(now)
        removed: dict[str, dict[str, int]] = {}
        if r.max_age_days is not None or r.max_reports is not None:
            for scenario in self.store.retention_scenarios(max_age_days=r.max_age_days, max_reports=r.max_reports,
                                                           now=now):
                got = self.store.apply_retention(scenario, max_age_days=r.max_age_days,
                                                 max_reports=r.max_reports, now=now)
                if any(got.values()):
                    removed[scenario] = {**got, "episodes": 0}
        if r.episodes_days is not None:
            for scenario, n in self.store.remove_episodes(now - timedelta(days=r.episodes_days)).items():
                removed.setdefault(scenario, {"reports": 0, "records": 0, "episodes": 0})["episodes"] = n
        for scenario, got in sorted(removed.items()):
            total = self._removed.setdefault(scenario, {"reports": 0, "records": 0, "episodes": 0})
            for key, n in got.items():
                total[key] += n
            log.info("retention: removed %d report(s), %d record(s) and %d episode(s) of scenario %s",
                     got["reports"], got["records"], got["episodes"], scenario)
        return removed

    # ------------------------------------------------------------------ internals

    def _settle_interrupted(self) -> None:
        """Candidates an ended process left unsettled: once the release chain is caught up,
        published ones (in the chain, but the process died before marking them) are marked so,
        the others become errors and their experience returns to the pool under the return
        rule. Only in scenarios whose lease this process can take (free, expired, or held by a
        dead process of this host): a live server's running step is not touched; the next
        holder settles its candidates if it dies."""
        stuck = {row.scenario for row in self.store.candidates_with_status(_INTERRUPTED)}
        for scenario in sorted(stuck):
            holding = self.leases.acquire(scenario)
            if holding is None:
                log.info("%s: unsettled candidates left alone: another server holds the growth lease", scenario)
                continue
            try:
                settle_ended_steps(self.reef.releases.chain, self.store, scenario, holding.token,
                                   self.settings.loop.max_attempts)
            except Exception:  # the release chain cannot be read now: the scenario's next step settles them
                log.exception("%s: unsettled candidates left for the next growth step: catching up the "
                              "release chain failed", scenario)
            finally:
                self.leases.release(holding)

    def _scenarios_to_check(self) -> list[str]:
        """Scenarios a growth step may find experience in: the configured ones and those with
        reports no candidate consumed yet (one query). Experience is always an unconsumed
        report, so a scenario without one has nothing to learn until a report arrives, and
        ``report_stored`` pokes it then."""
        return sorted(set(self.configured_scenarios()) | set(self.store.scenarios_with_pending_reports()))

    async def _schedule(self, every_s: float) -> None:
        """Poke the scenarios with something to learn every ``every_s`` seconds; this also
        finds reports stored without a ``report_stored`` event here (another process, the CLI)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                due = await asyncio.to_thread(self._scenarios_to_check)
            except asyncio.CancelledError:
                raise
            except Exception:  # keep scheduling; the next round asks the store again
                log.exception("listing the scenarios with pending reports failed")
                due = sorted(set(self.configured_scenarios()) | set(self.workers))
            for scenario in due:
                self.poke(scenario)

    def _remember_run(self, now: datetime) -> None:
        self._retention_last_ts = now.timestamp()
        try:
            (self.reef.state_dir / _RETENTION_FILE).write_text(json.dumps({"last_run": now.timestamp()}))
        except OSError:  # only the once-an-hour bound across restarts depends on it
            log.warning("could not record the retention run in %s", self.reef.state_dir, exc_info=True)

    def _retention_wait(self) -> float:
        """Seconds until retention is due: an hour after the last run, also one of an earlier process."""
        last = self._retention_last_ts
        try:
            last = max(last, float(json.loads((self.reef.state_dir / _RETENTION_FILE).read_text())["last_run"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # never ran here, or the file is unreadable: due now (or after this process's last run)
        return max(last + RETENTION_EVERY_S - time.time(), 0.0) if last else 0.0

    async def _retention_schedule(self) -> None:
        """Retention at start-up (unless it ran less than an hour ago), then hourly."""
        await asyncio.sleep(RETENTION_START_DELAY_S)
        while True:
            await asyncio.sleep(self._retention_wait())
            try:
                await asyncio.to_thread(self.run_retention)
            except asyncio.CancelledError:
                raise
            except Exception:  # keep the schedule; the next run retries
                log.exception("retention failed; it runs again in an hour")
