"""What each scenario serves, kept right: a kernel service that needs no learning loop.

``ServingReleases`` owns the release chain (artifact store + database), the serving table
(scenario → materialized ``ActiveRelease``, frozen into each request at its start), harness
application on requests, and the ways the table changes:

- ``start``: crash recovery (reconcile the database with the artifact store when they
  disagree), then every scenario's head release is served;
- ``activate``: a release just published here (growth step, rollback) is swapped in, then
  recorded in the database, then announced (``release_published``);
- the follower: releases published by another process (``reef grow``/``reef rollback`` from
  the CLI, another server on the same database) are noticed within ``FOLLOW_INTERVAL_S`` and
  swapped in;
- ``rollback``: a past release's content, or the base model's (``BASE``: an empty artifact),
  published as the new head; nothing when the head already has it.

Releases read from the chain are untrusted (``release_checks``): one that is refused is never
served, the scenario keeps serving its last good release, and ``refused`` says why.

A server that only serves (``loop.enabled=false``, or a kernel built without the learning
loop) still serves and follows its releases.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..store import RecordStore, Release
from ..types import ActiveRelease
from .artifacts import StoredRelease
from .chain import BASE, ReleaseChain
from .faults import fault_point
from .harness import HarnessCache
from .lineage import Lineages
from .release_checks import Refusal, ReleaseRefused

log = logging.getLogger("reef.releases")

#: seconds between checks of the artifact store for releases published by another process
FOLLOW_INTERVAL_S = 2.0


@dataclass(frozen=True)
class RollbackResult:
    """What ``ServingReleases.rollback`` did.

    ``release`` is the scenario's head afterwards (None: it has no release and serves the base
    model), ``published`` whether the rollback added it (False: the head already had the
    target's content, so nothing changed), ``message`` says which for a person.
    """

    release: Release | None
    published: bool
    message: str


def _unchanged(scenario: str, target: str, head: Release | None) -> str:
    """Why a rollback to ``target`` published nothing: ``head`` already serves that content."""
    if head is None:
        return f"scenario {scenario!r} has no release, so it serves the base model already; nothing was published"
    if target == BASE:
        return (f"release {head.release_id}, the head of {scenario!r}, already serves the base model "
                f"(no harness, no adapter); nothing was published")
    if target == head.release_id:
        return f"release {target} is already the head of {scenario!r} and serves; nothing was published"
    return (f"release {head.release_id}, the head of {scenario!r}, already serves the content of release "
            f"{target}; nothing was published")


class ServingReleases:
    """The serving table of one kernel and the release chain behind it.

    ``artifacts`` is the configured artifact store (conformed to its contract here),
    ``runtime`` what activates a release (``Runtime.activate``), ``on_published`` is told
    about each release this process starts serving because it was published (not about the
    head releases served at start-up).
    """

    def __init__(self, *, artifacts: Any, store: RecordStore, runtime: Any, state_dir: Path,
                 on_published: Callable[[Release], None]):
        self.chain = ReleaseChain(artifacts, store, state_dir / "releases")
        #: each scenario's learner lineage (``reef_core.commit.lineage``): a rollback resets it
        self.lineages = Lineages(state_dir)
        #: the artifact store, its optional members resolved (``reef_core.contracts.ArtifactStore``)
        self.artifacts = self.chain.artifacts
        self.store = store
        self.runtime = runtime
        #: parsed harnesses by release: the request path reads a release's files once
        self.harness = HarnessCache()
        self._on_published = on_published
        self._serving: dict[str, ActiveRelease] = {}
        self._commits: dict[str, str] = {}  # scenario → chain head dealt with: served, or refused
        self._sequences: dict[str, int] = {}  # scenario → position in its chain of the release ``_swap`` served
        #: scenario → a release served here whose row could not be written: announced once recorded
        self._unannounced: dict[str, str] = {}
        self._lock = asyncio.Lock()  # one swap at a time: publisher and follower never both announce
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ the request path

    def serving(self, scenario: str) -> ActiveRelease | None:
        """The release ``scenario`` serves now (None before its first)."""
        return self._serving.get(scenario)

    def refused(self, scenario: str) -> Refusal | None:
        """The release of ``scenario``'s chain this process refused and does not serve (None:
        it serves its chain's head, or has nothing to serve)."""
        return self.chain.refusals.get(scenario)

    def refused_releases(self) -> dict[str, Refusal]:
        """``refused`` of every scenario that has a refused release."""
        return self.chain.refusals.all()

    def apply_harness(self, body: dict[str, Any], dialect: str, release: ActiveRelease | None) -> dict[str, Any]:
        """``body`` with ``release``'s harness (system prompt, rules, skills) injected; as is
        without a release. Harness files are parsed once per release and cached."""
        if release is None:
            return body
        return self.harness.apply(body, dialect, release)

    # ------------------------------------------------------------------ changes

    async def current(self, scenario: str, head: Release | None) -> ActiveRelease | None:
        """The materialized ``head`` (what ``scenario`` serves, or is about to)."""
        if head is None:
            return None
        serving = self._serving.get(scenario)
        if serving is not None and serving.release_id == head.release_id:
            return serving
        return await asyncio.to_thread(self.chain.materialize, head)

    async def serve(self, release: ActiveRelease) -> None:
        """Activate an already materialized ``release`` in the runtime, then route new requests
        to it (hot swap). Requests that started before keep the release they started with."""
        async with self._lock:
            await self.runtime.activate(release)
            self._serving[release.scenario] = release
            self._sequences.pop(release.scenario, None)  # not a chain position: any head may follow

    async def activate(self, stored: StoredRelease) -> Release:
        """Serve a release just published in the artifact store, then record it in the
        database (the order crash recovery relies on) and announce it."""
        swapped = await self._swap(stored)
        fault_point("served")
        try:
            row = await asyncio.to_thread(self.chain.record, stored)
        except BaseException:
            # the database did not take the row (it went away, say): the follower, which skips a
            # head this process dealt with, must look at this one again, record it from the store
            # once the database answers (``reconcile``) and announce it then
            if self._commits.get(stored.scenario) == stored.commit:
                self._commits.pop(stored.scenario, None)
            if swapped:
                self._unannounced[stored.scenario] = stored.release_id
            raise
        if swapped:
            self._on_published(row)
        return row

    async def serve_head(self, scenario: str) -> Release | None:
        """Serve ``scenario``'s head release (the database's) if this process serves another,
        and announce it; the head. A growth lease holder calls it once it caught the chain up
        (``ReleaseChain.catch_up``), so serving follows a recovered head without the follower."""
        head = await asyncio.to_thread(self.chain.head, scenario)
        if head is not None and await self._swap(head):
            self._on_published(head)
        return head

    async def rollback(self, scenario: str, target: str, *, serve: bool = True) -> RollbackResult:
        """Publish ``target``'s content (a release id, or ``BASE``: no harness and no adapter) as
        ``scenario``'s new head and serve it; nothing when the head already has that content.

        ``serve=False`` (a one-shot CLI kernel, whose runtime never starts) publishes and records
        only: a server on the same state follows the new head within ``FOLLOW_INTERVAL_S``.
        """
        stored = await asyncio.to_thread(self.chain.rollback, scenario, target)
        what = "base (no harness, no adapter)" if target == BASE else target
        if stored is None:
            head = await asyncio.to_thread(self.chain.head, scenario)
            # a rollback to what serves still undoes what the lineage learnt past it
            reset = await asyncio.to_thread(self._reset_lineage, scenario, head.release_id if head else None, what)
            if serve and head is not None and await self._swap(head):  # a head the follower had not reached yet
                self._on_published(head)
            return RollbackResult(head, False, _unchanged(scenario, target, head) + reset)
        row = await self.activate(stored) if serve else await asyncio.to_thread(self.chain.record, stored)
        reset = await asyncio.to_thread(self._reset_lineage, scenario, row.release_id, what)
        return RollbackResult(row, True, f"published release {row.release_id} (#{row.sequence}) of {scenario!r}: "
                                         f"rollback to {what}, content {row.content_hash[:12]}" + reset)

    def _reset_lineage(self, scenario: str, release_id: str | None, what: str) -> str:
        """After a rollback the scenario's lineage (if it has one) starts again from the release
        rolled back to: what it learnt past that release is what the rollback undoes. Returns
        what to add to the rollback's message ("" without a lineage). A reset that fails is
        logged: the next step finds serving moved away from the lineage and resets it then."""
        try:
            head = self.lineages.head(scenario)
            if head is None:
                return ""
            self.lineages.reset(scenario, to_release=release_id, reason=f"reef rollback to {what}")
        except Exception:
            log.exception("%s: resetting the learner lineage after the rollback failed", scenario)
            return "; resetting the learner lineage failed (the server log says why): its next step resets it"
        dropped = head.step - (head.published_step or 0)
        return (f"; the learner lineage starts again from {release_id or 'the base model'}"
                + (f" ({dropped} unpublished step(s) dropped)" if head.checkpoint is not None and dropped else ""))

    # ------------------------------------------------------------------ lifecycle

    async def start(self, *, follow: bool = True) -> None:
        """Recover, serve every scenario's head, then (``follow``) start the follower.

        The store queries here do not depend on how many scenarios exist: scenarios without a
        release cost nothing at start-up.
        """
        heads = await asyncio.to_thread(self._recover)
        for scenario in sorted(heads):
            await self._serve_head(heads[scenario])
        if follow:
            self._tasks.append(asyncio.create_task(self._follow(), name="reef-release-follower"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # stopping regardless of how they end
        self._tasks.clear()

    def dead_tasks(self) -> list[str]:
        """The follower, when it ended by itself (it catches its own errors, so it is broken)."""
        return [t.get_name() for t in self._tasks if t.done()]

    # ------------------------------------------------------------------ internals

    def _recover(self) -> dict[str, Release]:
        """Reconcile the chain when the database and the artifact store disagree; return
        {scenario: head release}."""
        heads = self.store.head_releases()
        if not self._chain_agrees(heads):
            added = self.chain.reconcile()
            if added:
                log.warning("recorded %d release(s) the database had missed", len(added))
            heads = self.store.head_releases()
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
        if self.artifacts.heads() != {scenario: row.git_commit for scenario, row in heads.items()}:
            return False
        return all(counts.get(scenario) == row.sequence for scenario, row in heads.items())

    async def _serve_head(self, head: Release) -> None:
        """Serve ``head``, or the newest earlier release of its chain when ``head`` is refused: a
        refused release never stops a server from starting."""
        try:
            await self._swap(head)
            return
        except ReleaseRefused as exc:
            self._refuse(head, exc)
        for row in await asyncio.to_thread(self.store.list_releases, head.scenario):
            if row.sequence < head.sequence:
                try:
                    await self._swap(row)
                    return
                except ReleaseRefused as exc:
                    log.warning("%s: not serving release %s either: %s", head.scenario, row.release_id, exc)

    def _refuse(self, release: Release, exc: ReleaseRefused) -> None:
        serving = self._serving.get(release.scenario)
        self.chain.refusals.refuse(release.scenario, release.git_commit or "", str(exc), position=release.sequence,
                                   last_good=serving.release_id if serving else None)

    async def _swap(self, release: Release | StoredRelease) -> bool:
        """Serve ``release`` unless it already serves; True when this call swapped it in.

        Never back along the chain: a caller that read ``release`` as the head before a later one
        was swapped in (the follower, ``serve_head``, while a rollback or a growth step published)
        holds a stale head, and serving it would undo the newer release until the follower's
        next round."""
        async with self._lock:
            serving = self._serving.get(release.scenario)
            if serving is not None and release.sequence < self._sequences.get(release.scenario, 0):
                log.info("%s: not serving release %s (#%d): release %s, later in the chain, serves already",
                         release.scenario, release.release_id, release.sequence, serving.release_id)
                return False
            swapped = serving is None or serving.release_id != release.release_id
            if swapped:
                active = await asyncio.to_thread(self.chain.materialize, release)
                await self.runtime.activate(active)
                self._serving[release.scenario] = active
            self._sequences[release.scenario] = release.sequence
            commit = release.commit if isinstance(release, StoredRelease) else release.git_commit
            self._commits[release.scenario] = commit or ""
            self.chain.refusals.served(release.scenario, release.sequence, commit)
            return swapped

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL_S)
            try:
                heads = await asyncio.to_thread(self.artifacts.heads)
                moved = [s for s, c in heads.items() if self._commits.get(s) != c]
                if moved:  # only those scenarios: the cost stays independent of idle ones
                    await asyncio.to_thread(self.chain.reconcile, moved)
                    for scenario in moved:
                        head = await asyncio.to_thread(self.chain.head, scenario)
                        if head is not None and self._commits.get(scenario) != head.git_commit:
                            log.info("%s: following release %s published elsewhere", scenario, head.release_id)
                            try:
                                swapped = await self._swap(head)
                                if swapped or self._unannounced.get(scenario) == head.release_id:
                                    self._on_published(head)
                                self._unannounced.pop(scenario, None)
                            except ReleaseRefused as exc:
                                self._refuse(head, exc)
                        if self.chain.refusals.get(scenario) is not None:
                            # this head was read and refused: read it again only once the chain moves
                            self._commits[scenario] = heads[scenario]
            except asyncio.CancelledError:
                raise
            except Exception:  # keep following; the next round retries
                log.exception("following the release chain failed")
