"""The release chain: the artifact store (source of truth) plus the ``releases`` table.

Publishing is: the artifact store first (``publish``), then serving (the caller activates
the release), then the database (``record``). The artifact store's compare-and-swap is the
commit point: once the scenario's ref moved, the release exists, and the database row is a
copy that ``reconcile`` can always rebuild from the manifests. The database can therefore
lag the store after a crash, never lead it; a growth lease holder catches it up
(``catch_up``) before it settles a dead step's candidate or builds on the head.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..contracts import ArtifactStore
from ..errors import ConflictError, NotFoundError, ReefError
from ..protocols import conform
from ..store import RecordStore, Release, new_id
from ..types import ActiveRelease
from .artifacts import (
    MANIFEST_FORMAT,
    ArtifactError,
    StoredRelease,
    content_hash,
    copy_artifact,
    describe,
)
from .faults import fault_point
from .harness import check_harness
from .release_checks import Refusals, check_publishable, check_served, trusted_history

log = logging.getLogger("reef.commit")

#: materialized release directories kept per scenario (older ones are pruned)
KEEP_MATERIALIZED = 4

#: the rollback target that is no release: an empty artifact (no harness, no adapter), so the
#: runtime's model answers as it is, as before the scenario's first release
BASE = "base"

#: the content hash of an empty artifact: what a scenario without releases serves
EMPTY_CONTENT = hashlib.sha256().hexdigest()


class ChainInconsistent(ReefError):
    """The database lists releases the artifact store does not have."""


class ReleaseChain:
    """Publishes, rolls back, reconciles and materializes the releases of every scenario."""

    def __init__(self, artifacts: ArtifactStore, records: RecordStore, releases_dir: Path):
        self.artifacts: ArtifactStore = conform("artifact_store", artifacts)
        self.records = records
        self.releases_dir = Path(releases_dir)
        self._materialize_lock = threading.Lock()
        #: releases read from the chain and refused (``release_checks``), for status and metrics
        self.refusals = Refusals()
        #: ids of releases this process put in the artifact store and has not recorded yet: the
        #: follower that reconciles one in that window is no sign of a crash (``reconcile``)
        self._publishing: set[str] = set()

    # ------------------------------------------------------------------ reading

    def head(self, scenario: str) -> Release | None:
        return self.records.head_release(scenario)

    def get(self, scenario: str, release_id: str) -> Release:
        row = self.records.get_release(release_id)
        if row is None or row.scenario != scenario:
            raise NotFoundError(f"scenario {scenario!r} has no release {release_id!r}")
        return row

    def manifest(self, row: Release) -> dict[str, Any]:
        """The ``reef-release.json`` the artifact store holds for ``row``."""
        return self.artifacts.read_manifest(row.git_commit)

    def diff(self, row: Release) -> str | None:
        """Unified diff of a release's files against its parent's (or the empty tree); None when
        the artifact store cannot diff."""
        parent = self.records.get_release(row.parent_id) if row.parent_id else None
        return self.artifacts.diff(parent.git_commit if parent else None, row.git_commit)

    # ------------------------------------------------------------------ writing

    def publish(self, scenario: str, artifact_dir: Path, *, expected_head: str | None,
                operation: str = "train", candidate_id: str | None = None,
                evaluation: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> StoredRelease:
        """Publish ``artifact_dir`` in the artifact store as the release after ``expected_head``
        (a release id; None: the first release). Raises PublishConflict when the chain moved past
        ``expected_head``. The caller activates the release, then calls ``record``."""
        parent = self.records.get_release(expected_head) if expected_head else None
        if expected_head and parent is None:
            raise NotFoundError(f"expected head {expected_head!r} is not a release of {scenario!r}")
        chash, sums = describe(artifact_dir)
        manifest = {
            "format": MANIFEST_FORMAT,
            "scenario": scenario,
            "release_id": new_id("rel"),
            "sequence": (parent.sequence if parent else 0) + 1,
            "parent": expected_head,
            "content_hash": chash,
            "files": sums,
            "operation": operation,
            "candidate_id": candidate_id,
            "evaluation": evaluation,
            "created_at": datetime.now(timezone.utc).isoformat(),
            **(extra or {}),
        }
        check_publishable(scenario, manifest)
        stored = self.artifacts.publish(scenario, Path(artifact_dir), manifest,
                                        expected_head=parent.git_commit if parent else None)
        self._publishing.add(stored.release_id)
        fault_point("git_published")
        return stored

    def rollback(self, scenario: str, target: str, *, expected_head: str | None = None) -> StoredRelease | None:
        """Publish the content of an earlier release, or of ``BASE`` (an empty artifact: no
        harness and no adapter, the runtime's model as it is), as a new release on top of the
        head; history is kept.

        None when the head already has that content (it is the target, a rollback to it, or
        the scenario has no release and ``target`` is ``BASE``): publishing it again would only
        add a duplicate link to the chain. ``NotFoundError`` for a target that is no release of
        ``scenario``.
        """
        head = self.get(scenario, expected_head) if expected_head else self.head(scenario)
        row = None if target == BASE else self.get(scenario, target)
        wanted = EMPTY_CONTENT if row is None else row.content_hash
        if (head.content_hash if head is not None else EMPTY_CONTENT) == wanted:
            return None
        with tempfile.TemporaryDirectory(prefix="reef-rollback-") as tmp:
            tree = Path(tmp) / "tree"
            if row is None:
                tree.mkdir()
            else:
                self.artifacts.materialize(scenario, row.git_commit, tree)
            return self.publish(scenario, tree, expected_head=head.release_id if head else None,
                                operation="rollback", extra={"rollback_to": target})

    def record(self, stored: StoredRelease) -> Release:
        """Write the database row of a published release (idempotent: the existing row when
        ``reconcile`` or another process recorded it first) and mark its candidate published."""
        row = Release(
            scenario=stored.scenario, sequence=stored.sequence, release_id=stored.release_id,
            parent_id=stored.parent_id, content_hash=stored.content_hash, operation=stored.operation,
            git_commit=stored.commit, candidate_id=stored.candidate_id,
            evaluation=stored.manifest.get("evaluation"),
        )
        self._publishing.discard(stored.release_id)
        try:
            self.records.add_release(row)
        except ConflictError:
            existing = self.records.get_release(stored.release_id)
            if existing is None:
                raise ChainInconsistent(
                    f"release {stored.sequence} of {stored.scenario!r} in the database is not the one "
                    f"in the artifact store ({stored.release_id}); restore the database or the store"
                ) from None
            return existing
        fault_point("release_recorded")
        if stored.candidate_id and self.records.get_candidate(stored.candidate_id) is not None:
            self.records.update_candidate(stored.candidate_id, status="published", release_id=stored.release_id)
            fault_point("candidate_published")
        return row

    # ------------------------------------------------------------------ recovery

    def reconcile(self, scenarios: list[str] | None = None) -> list[Release]:
        """Make the database agree with the artifact store; return the release rows it wrote.
        ``scenarios`` limits the work to those (the follower passes the ones whose head moved).

        Releases in the store but not the database (a crash between the two writes, or another
        process between its two writes right now) are recorded from their manifests, oldest
        first. Releases in the database that the store lacks mean the store was replaced or
        damaged: a ChainInconsistent error says so.

        Other processes may publish while this runs. Publishing writes the store first and the
        database second, so the database may lag the store but never lead it: reading the
        database *first* and the store *second* gives a view in which every row read is in the
        store's history. The store is read once more before a missing release is called
        corruption, so a stale read (a cached history, a store that answered before a
        concurrent ref update was visible) cannot stop a healthy server.
        """
        added: list[Release] = []
        if scenarios is None:
            names = set(self.records.scenario_names())  # the database before the store, as below
            names |= set(self.artifacts.scenarios())
        else:
            names = set(scenarios)
        for scenario in sorted(names):
            rows = self.records.list_releases(scenario, newest_first=False)
            history = list(reversed(self.artifacts.history(scenario)))
            stored_ids = {s.release_id for s in history}
            if any(row.release_id not in stored_ids for row in rows):
                history = list(reversed(self.artifacts.history(scenario)))
                stored_ids = {s.release_id for s in history}
                for row in rows:
                    if row.release_id not in stored_ids:
                        raise ChainInconsistent(
                            f"the database lists release {row.release_id} of scenario {scenario!r}, but the "
                            f"artifact store does not have it; restore the artifact store or the database"
                        )
            recorded = {row.release_id for row in rows}
            for stored in trusted_history(scenario, history, self.refusals):  # refused ones are never recorded
                if stored.release_id in recorded or self.records.get_release(stored.release_id) is not None:
                    continue
                if stored.release_id in self._publishing:  # this process is between the two writes
                    log.debug("recording release %s of %s, which this process is publishing", stored.release_id,
                              scenario)
                else:
                    log.warning("recording release %s of %s from the artifact store (the database missed it: "
                                "a crash while publishing, or another process is publishing it now)",
                                stored.release_id, scenario)
                added.append(self.record(stored))
        return added

    def catch_up(self, scenario: str) -> Release | None:
        """Make the database's chain of ``scenario`` the artifact store's (``reconcile``) and
        return its head: what a lease holder does before settling another step's candidates
        or building on the head (the publish sequence: ``reef_core.grow.step``).

        A store that caches a remote (``sync()``, as the git store with ``remote`` has) must
        fetch first: a stale cache could hide a release a dead step pushed, and its candidate
        would be settled as unpublished. ArtifactError when it cannot; nothing is settled then.
        """
        sync = getattr(self.artifacts, "sync", None)
        if callable(sync) and sync() is False:
            raise ArtifactError(f"the release chain of {scenario!r} could not be fetched from the artifact store's "
                                "remote, so it is unknown what was published last; growth waits until it answers")
        head = self.head(scenario)  # the database first, as in reconcile: it may lag the store, never lead it
        stored = self.artifacts.head(scenario)
        if (stored.commit if stored else None) != (head.git_commit if head else None):
            self.reconcile([scenario])  # chains are append-only: equal heads leave nothing to record
            head = self.head(scenario)
        return head

    # ------------------------------------------------------------------ serving

    def materialize(self, release: Release | StoredRelease) -> ActiveRelease:
        """The release (a database row or a stored release) as a directory under
        ``releases_dir``, made once and reused afterwards."""
        check_served(release)
        commit = release.commit if isinstance(release, StoredRelease) else release.git_commit
        scenario_dir = self.releases_dir / quote(release.scenario, safe="")
        final = scenario_dir / release.release_id
        with self._materialize_lock:
            if not final.is_dir():
                scenario_dir.mkdir(parents=True, exist_ok=True)
                tmp = scenario_dir / f".tmp-{uuid.uuid4().hex}"
                try:
                    self.artifacts.materialize(release.scenario, commit, tmp)
                    try:
                        os.replace(tmp, final)
                    except OSError:
                        if not final.is_dir():  # else another process materialized it first
                            raise
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
            self._prune(scenario_dir, keep=final)
        return ActiveRelease(scenario=release.scenario, release_id=release.release_id,
                             content_hash=release.content_hash, path=final)

    @staticmethod
    def _prune(scenario_dir: Path, keep: Path) -> None:
        dirs = sorted((d for d in scenario_dir.iterdir() if d.is_dir() and not d.name.startswith(".")),
                      key=lambda d: d.stat().st_mtime, reverse=True)
        for d in dirs[KEEP_MATERIALIZED:]:
            if d != keep:
                shutil.rmtree(d, ignore_errors=True)


def stage_candidate(artifact_dir: Path, dest: Path) -> tuple[Path, str]:
    """Copy a recipe's artifact out of its scratch space and check that it can be served;
    return (copy, content hash)."""
    copy = copy_artifact(artifact_dir, dest)
    check_harness(copy)
    return copy, content_hash(copy)
