"""The learning loop of a running kernel: workers, triggers, release chain and serving state.

``LearningLoop`` is created by ``reef_core.learning.install_learning`` and lives in
``reef.extensions["learning"]``. On start it reconciles the release chain with the database,
serves every scenario's head release, starts the growth workers, the schedule, and a
follower that notices releases published by another process (``reef rollback``/``reef grow``
from the CLI, or another server sharing the database) and hot-swaps them in.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ..commit.artifacts import StoredRelease
from ..commit.chain import ReleaseChain
from ..commit.gate import EvalContext
from ..commit.harness import HarnessCache
from ..observe import build_filters, eligible
from ..plugins import instantiate
from ..store import Release
from ..types import ActiveRelease, PublishedRelease
from .progress import LogProgress
from .step import StepResult
from .worker import ScenarioWorker

if TYPE_CHECKING:
    from ..kernel import Reef

log = logging.getLogger("reef.loop")

#: seconds between checks of the artifact store for releases published by another process
FOLLOW_INTERVAL_S = 2.0
#: evaluation timeout for evaluators that declare no ``timeout_s``
DEFAULT_EVAL_TIMEOUT_S = 1800.0
#: the scenario status counts eligible experience up to this many (a bound on its cost)
STATUS_COUNT_CAP = 1000
_INTERRUPTED = ("proposed", "evaluating", "selected")


class LearningLoop:
    """Observe → Grow → Commit for every scenario of one kernel."""

    def __init__(self, reef: Reef):
        self.reef = reef
        self.store = reef.store
        self.settings = reef.settings
        state = reef.state_dir
        name, options = self.settings.group("artifact_store")
        self.artifacts = instantiate("artifact_store", name, options, reef.plugins,
                                     state_dir=state, settings=self.settings)
        self.chain = ReleaseChain(self.artifacts, self.store, state / "releases")
        self.artifacts = self.chain.artifacts  # conformed: the optional members resolved
        self.harness = HarnessCache()
        self.scratch_root = state / "scratch"
        self.candidates_root = state / "candidates"
        self.scratch_root.mkdir(parents=True, exist_ok=True)
        self.default_eval_timeout_s = DEFAULT_EVAL_TIMEOUT_S
        #: False for one-shot use (the CLI): no workers, schedule or follower on start
        self.background = True
        self.workers: dict[str, ScenarioWorker] = {}
        self._recipes: dict[str, tuple[str, Any, list]] = {}
        self._evaluators: dict[str, tuple[str, Any]] = {}
        self._serving_commits: dict[str, str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._swap_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task] = []
        for scenario in self.configured_scenarios():
            self.recipe_for(scenario)
            self.evaluator_for(scenario)

    # ------------------------------------------------------------------ configuration

    def configured_scenarios(self) -> list[str]:
        return sorted({self.settings.server.default_scenario, *self.settings.scenarios})

    def recipe_for(self, scenario: str) -> tuple[str, Any, list]:
        """(name, recipe, built filters) of ``scenario``: the root recipe with the scenario's
        ``recipe_options`` over its options; the recipe's filters, then the config's."""
        if scenario not in self._recipes:
            name, options = self.settings.group("recipe")
            sc = self.settings.scenarios.get(scenario)
            if sc is not None:
                options = {**options, **sc.recipe_options}
            recipe = instantiate("recipe", name, options, self.reef.plugins, state_dir=self.reef.state_dir,
                                 store=self.store, settings=self.settings)
            specs = list(recipe.filters or ()) + list(sc.filters if sc is not None else ())
            filters = build_filters(specs, self.reef.plugins, store=self.store, settings=self.settings)
            self._recipes[scenario] = (name, recipe, filters)
        return self._recipes[scenario]

    def evaluator_for(self, scenario: str) -> tuple[str, Any]:
        """(name, evaluator) of ``scenario``: ``scenarios.<s>.evaluator`` (with its
        ``evaluator_options``) when set, else the root ``evaluator`` group, whose default
        (``recipe_default``) is the recipe's own ``default_evaluator``."""
        if scenario not in self._evaluators:
            name, options = self.settings.evaluator_for(scenario)
            if name is None:  # evaluator=recipe_default: the recipe says how it is judged
                name = self.recipe_for(scenario)[1].default_evaluator
            evaluator = instantiate("evaluator", name, options, self.reef.plugins, state_dir=self.reef.state_dir,
                                    store=self.store, settings=self.settings)
            self._evaluators[scenario] = (name, evaluator)
        return self._evaluators[scenario]

    def eval_context(self, scenario: str, progress: Any) -> EvalContext:
        runtime = self.reef.runtime
        model = self.settings.runtime.get("model")
        if not model:
            models = runtime.models()
            model = models[0] if models else None
        return EvalContext(scenario=scenario, runtime=runtime, loop=self._running_loop(),
                           apply_harness=self.harness.apply, log=logging.getLogger("reef.eval"),
                           progress=progress or LogProgress(logging.getLogger("reef.progress"), label=scenario),
                           default_model=model)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop or asyncio.get_running_loop()

    # ------------------------------------------------------------------ serving

    async def current_release(self, scenario: str, head: Release | None) -> ActiveRelease | None:
        """The materialized ``head`` (what the scenario serves, or is about to)."""
        if head is None:
            return None
        serving = self.reef.serving_release(scenario)
        if serving is not None and serving.release_id == head.release_id:
            return serving
        return await asyncio.to_thread(self.chain.materialize, head)

    async def activate(self, stored: StoredRelease) -> Release:
        """Serve a release just published in the artifact store, then record it in the
        database (the order the crash recovery relies on) and tell observers."""
        swapped = await self._swap(stored)
        row = await asyncio.to_thread(self.chain.record, stored)
        if swapped:
            self.reef.emit("release_published", release=PublishedRelease.from_row(row))
        return row

    # ------------------------------------------------------------------ lifecycle

    async def start(self, reef: Reef) -> None:
        """Recover, serve every scenario's head, then start the follower, workers and schedule.

        The store queries here do not depend on how many scenarios exist: scenarios without a
        release and without pending reports (any number of them) cost nothing at start-up.
        """
        self._loop = asyncio.get_running_loop()
        heads = await asyncio.to_thread(self._recover)
        for scenario in sorted(heads):
            await self._swap(heads[scenario])
        if not self.background:
            return
        self._tasks.append(asyncio.create_task(self._follow(), name="reef-release-follower"))
        if self.settings.loop.enabled:
            for scenario in await asyncio.to_thread(self._scenarios_to_check):
                self.poke(scenario)
            if self.settings.loop.schedule_s:
                self._tasks.append(asyncio.create_task(self._schedule(self.settings.loop.schedule_s),
                                                       name="reef-grow-schedule"))

    async def stop(self, reef: Reef) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # stopping regardless of how they end
        self._tasks.clear()
        for worker in list(self.workers.values()):
            await worker.stop()

    def _recover(self) -> dict[str, Release]:
        """Reconcile the chain when the database and the artifact store disagree, settle
        candidates a previous process left undecided; return {scenario: head release}."""
        heads = self.store.head_releases()
        if not self._chain_agrees(heads):
            added = self.chain.reconcile()
            if added:
                log.warning("recorded %d release(s) the database had missed", len(added))
            heads = self.store.head_releases()
        stuck = self.store.candidates_with_status(_INTERRUPTED)
        published = self.store.releases_of_candidates(row.id for row in stuck)
        for row in stuck:
            if row.id in published:  # recorded, but the process died before marking it
                self.store.update_candidate(row.id, status="published", release_id=published[row.id])
                continue
            self.store.update_candidate(
                row.id, status="error", decision=row.decision or "error",
                reason="interrupted: the server stopped before this candidate was published; "
                       "its experience stays consumed")
        return heads

    def _chain_agrees(self, heads: dict[str, Release]) -> bool:
        """Whether the database already agrees with the artifact store, so that ``reconcile``
        (which reads the history of every scenario, one by one) has nothing to do.

        They agree when every scenario has the same head commit in both and each database chain
        is complete (a head at sequence n and n rows): chains are append-only, so nothing can
        be missing below an agreeing head. The database is read before the store, as
        ``reconcile`` does: it may lag the store, never lead it, so a release another process
        publishes meanwhile shows up as a difference and the full reconcile runs.
        """
        counts = self.store.release_counts()
        store_heads = self._store_heads()
        if store_heads != {scenario: row.git_commit for scenario, row in heads.items()}:
            return False
        return all(counts.get(scenario) == row.sequence for scenario, row in heads.items())

    def _scenarios_to_check(self) -> list[str]:
        """Scenarios a growth step may find experience in: the configured ones and those with
        reports no candidate consumed yet (one query). Experience is always an unconsumed
        report, so a scenario without one has nothing to learn until a report arrives, and
        ``report_stored`` pokes it then."""
        return sorted(set(self.configured_scenarios()) | set(self.store.scenarios_with_pending_reports()))

    async def _swap(self, release: Release | StoredRelease) -> bool:
        """Serve ``release`` unless it already serves; True when this call swapped it in. One
        swap at a time, so the publisher and the follower never both announce a release."""
        async with self._swap_lock:
            serving = self.reef.serving_release(release.scenario)
            swapped = serving is None or serving.release_id != release.release_id
            if swapped:
                active = await asyncio.to_thread(self.chain.materialize, release)
                await self.reef.set_serving(active)
            commit = release.commit if isinstance(release, StoredRelease) else release.git_commit
            self._serving_commits[release.scenario] = commit or ""
            return swapped

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL_S)
            try:
                heads = await asyncio.to_thread(self._store_heads)
                moved = [s for s, c in heads.items() if self._serving_commits.get(s) != c]
                if moved:  # only those scenarios: the cost stays independent of idle ones
                    await asyncio.to_thread(self.chain.reconcile, moved)
                    for scenario in moved:
                        head = await asyncio.to_thread(self.chain.head, scenario)
                        if head is not None and self._serving_commits.get(scenario) != head.git_commit:
                            log.info("%s: following release %s published elsewhere", scenario, head.release_id)
                            if await self._swap(head):
                                self.reef.emit("release_published", release=PublishedRelease.from_row(head))
            except asyncio.CancelledError:
                raise
            except Exception:  # keep following; the next round retries
                log.exception("following the release chain failed")

    def _store_heads(self) -> dict[str, str]:
        return self.chain.artifacts.heads()

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

    # ------------------------------------------------------------------ triggers

    def worker(self, scenario: str) -> ScenarioWorker:
        worker = self.workers.get(scenario)
        if worker is None:
            worker = self.workers[scenario] = ScenarioWorker(self, scenario)
        return worker

    def poke(self, scenario: str) -> None:
        """Wake ``scenario``'s worker (event-loop thread only)."""
        if not (self.background and self.settings.loop.enabled):
            return
        worker = self.worker(scenario)
        worker.start()
        worker.poke()

    def on_report_stored(self, report: Any) -> None:
        """Listener for ``report_stored``: may run in any thread, never blocks."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.poke, report.scenario)

    async def grow(self, scenario: str, progress: Any = None) -> StepResult:
        """Run a growth step of ``scenario`` now (``POST .../grow``, ``reef grow``)."""
        return await self.worker(scenario).grow_now(progress)

    async def rollback(self, scenario: str, release_id: str) -> Release:
        """Publish ``release_id``'s content as the scenario's new head and serve it."""
        stored = await asyncio.to_thread(self.chain.rollback, scenario, release_id)
        return await self.activate(stored)

    def dead_tasks(self) -> list[str]:
        """Names of background tasks (follower, schedule, growth workers) that ended while the
        loop runs: each catches its own step's errors, so one that ended is broken for good."""
        dead = [t.get_name() for t in self._tasks if t.done()]
        dead += [f"reef-grow-{name}" for name, w in list(self.workers.items()) if w.died]
        return dead

    def status(self, scenario: str) -> dict[str, Any]:
        """Loop state for ``GET /reef/scenarios/{s}`` (blocking: reads the store)."""
        recipe_name, recipe, filters = self.recipe_for(scenario)
        evaluator_name, _ = self.evaluator_for(scenario)
        serving = self.reef.serving_release(scenario)
        worker = self.workers.get(scenario)
        pending = 0
        if recipe.update_target != "none":
            pending = len(eligible(self.store, scenario, filters, want=STATUS_COUNT_CAP))
        return {
            "recipe": recipe_name,
            "update_target": recipe.update_target,
            "batch_size": recipe.batch_size,
            "filters": [name for name, _ in filters],
            "evaluator": evaluator_name,
            "loop_enabled": self.settings.loop.enabled,
            "serving_release_id": serving.release_id if serving else None,
            "eligible": pending,
            **(worker.status() if worker else {"state": "idle", "steps": 0, "last_step": None}),
        }
