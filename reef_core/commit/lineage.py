"""The learner lineage of a scenario: the line of training states a weight recipe keeps.

Every training step of a recipe that keeps a lineage (``Recipe.keeps_lineage``) advances it,
whether or not the step's candidate is published; a candidate is a snapshot of the head (its
artifact is the head's checkpoint), so what a rejected or undecided candidate learned is not
lost. The lineage is never served by itself: serving moves only when the gate publishes a
snapshot.

Where it lives: ``<state_dir>/lineage/<scenario>/``, beside the server's other working state
(see docs/learning.md for why not the artifact store). ``HEAD.json`` names the head's
checkpoint directory under ``steps/`` and carries its metadata; a step is written whole
(copied, fsynced, renamed into ``steps/``) before ``HEAD.json`` is replaced by an atomic
rename, under a file lock and only if the head is still the one the step started from
(compare-and-swap). A process killed anywhere in between leaves the previous head intact:
the head is always the last completed step.

Fencing: a step runs under the scenario's growth lease, and the head moves only inside
``fence`` (``RecipeContext.fence``: the lease row locked and known to be held with the step's
token, ``RecordStore.fenced``) and only with a token not older than the one that wrote the
head (``HEAD.json`` records it): a step whose process lost the lease (paused or partitioned
past its expiry, its batch already settled and handed out again) is refused and never
advances the lineage with that batch.

A lineage continues only from a serving release it knows: the one that served when its head
was written, or its own snapshot (published). When serving moved anywhere else (a rollback,
another server's release) the recipe resets it to the serving release (``Lineages.reset``),
and ``reef rollback`` resets it at once, naming the release rolled back to.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import ConflictError, StoreError
from ..store.filelock import FileLock
from ..store.leases import LeaseLost
from .artifacts import copy_artifact

HEAD_FILE = "HEAD.json"
STEPS_DIR = "steps"

#: what a head moves inside: the growth lease's fence (None: unfenced, no lease in play)
Fence = Callable[[], AbstractContextManager[Any]] | None


@dataclass(frozen=True)
class LineageHead:
    """A scenario's lineage head. ``step``: training steps the lineage has taken (a reset
    keeps counting); ``checkpoint``: the last completed step's full learner checkpoint (an
    artifact directory: ``adapter/`` + ``learner/``), None when the lineage was reset and
    starts again from the serving release's state; ``id``: what a compare-and-swap expects."""

    scenario: str
    id: str
    step: int
    checkpoint: Path | None
    meta: dict[str, Any] = field(default_factory=dict)
    #: the last reset: {"at", "step", "to_release", "reason"} (None: never reset)
    last_reset: dict[str, Any] | None = None
    #: the lineage step of the last snapshot that was published (None: none yet)
    published_step: int | None = None
    published_release: str | None = None
    #: {release id: the lineage step whose state it serves} of the releases this lineage saw
    #: serve ("" the base model), the newest ``RELEASES_KEPT``
    releases: dict[str, int] = field(default_factory=dict)
    #: the growth lease token of the step that last moved the head (None: moved without one)
    lease_token: int | None = None

    def lag(self, release_id: str | None) -> int:
        """Policy lag, in lineage steps, of a rollout sampled from ``release_id``: how many
        steps this head is past the state that release serves (one this lineage never saw
        serving counts from the lineage's start)."""
        return max(self.step - self.releases.get(release_id or "", 0), 0)

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "id": self.id, "step": self.step,
                "checkpoint": str(self.checkpoint) if self.checkpoint else None, "meta": self.meta,
                "last_reset": self.last_reset, "published_step": self.published_step,
                "published_release": self.published_release, "lease_token": self.lease_token,
                "steps_since_publish": self.step - (self.published_step or 0)}


class Lineages:
    """Every scenario's lineage under ``<state_dir>/lineage``."""

    def __init__(self, state_dir: str | Path):
        self.root = Path(state_dir) / "lineage"

    def dir_of(self, scenario: str) -> Path:
        return self.root / _safe(scenario)

    def head(self, scenario: str) -> LineageHead | None:
        """The scenario's head, or None when it has no lineage yet."""
        path = self.dir_of(scenario) / HEAD_FILE
        data = _read_head(path)
        return None if data is None else self._head_of(scenario, path, data)

    def _head_of(self, scenario: str, path: Path, data: dict[str, Any]) -> LineageHead:
        """The head ``data`` (read from ``path``) stands for; ``StoreError`` when a field is not."""
        checkpoint = data.get("checkpoint")
        try:
            return LineageHead(scenario=scenario, id=str(data["id"]), step=int(data["step"]),
                               checkpoint=self.dir_of(scenario) / STEPS_DIR / checkpoint if checkpoint else None,
                               meta=dict(data.get("meta") or {}), last_reset=data.get("last_reset"),
                               published_step=data.get("published_step"),
                               published_release=data.get("published_release"),
                               releases={str(k): int(v) for k, v in (data.get("releases") or {}).items()},
                               lease_token=data.get("lease_token"))
        except (KeyError, TypeError, ValueError) as exc:
            raise _unreadable(path, f"{type(exc).__name__}: {exc}") from None

    def advance(self, scenario: str, checkpoint_dir: Path, meta: dict[str, Any], *, expected: str | None,
                steps: int = 1, fence: Fence = None, token: int | None = None) -> LineageHead:
        """Make a copy of ``checkpoint_dir`` the new head, ``steps`` training steps after the
        head ``expected`` (its id; None: the lineage must not exist yet), inside ``fence`` with
        the growth lease token ``token``. Raises ``ConflictError`` when the head is not
        ``expected`` any more, ``LeaseLost`` when the lease is not held with ``token`` or a
        newer token moved the head (nothing changes either way)."""
        sdir = self.dir_of(scenario) / STEPS_DIR
        sdir.mkdir(parents=True, exist_ok=True)
        new_id = _new_id()
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=sdir))
        try:
            copy_artifact(checkpoint_dir, tmp / "c")
            _fsync_tree(tmp / "c")
            os.replace(tmp / "c", sdir / new_id)
            _fsync_dir(sdir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        try:
            return self._swap(scenario, expected, fence=fence, token=token, change=lambda old: {
                **_carried(old), "id": new_id, "step": (old["step"] if old else 0) + steps,
                "checkpoint": new_id, "meta": meta,
                # the serving release this lineage first trained against starts at its step then
                "releases": _seen(old, meta.get("serving"), old["step"] if old else 0, keep=True)})
        except BaseException:
            shutil.rmtree(sdir / new_id, ignore_errors=True)
            raise

    def reset(self, scenario: str, *, to_release: str | None, reason: str,
              expected: str | None | type = ..., fence: Fence = None, token: int | None = None) -> LineageHead:
        """Drop the head's checkpoint: training continues from ``to_release``'s state (the
        serving release), and the reset is remembered with ``reason``. ``expected``: the head
        id this reset replaces (default: whatever the head is); ``fence``/``token``: a step's
        growth lease, as for ``advance`` (a reset by hand or by a rollback takes none)."""
        at = datetime.now(timezone.utc).isoformat()

        def reset(old: dict[str, Any] | None) -> dict[str, Any]:
            step = old["step"] if old else 0
            return {**_carried(old), "id": _new_id(), "step": step, "checkpoint": None,
                    "meta": {"serving": to_release}, "published_step": step, "published_release": to_release,
                    "releases": _seen(old, to_release, step),
                    "last_reset": {"at": at, "step": step, "to_release": to_release, "reason": reason}}

        return self._swap(scenario, expected, reset, fence=fence, token=token)

    def note_published(self, scenario: str, head_id: str, release_id: str) -> LineageHead | None:
        """Record that the snapshot of head ``head_id`` was published as ``release_id`` (the
        lineage continues from it); nothing when the head moved meanwhile."""
        try:
            return self._swap(scenario, head_id, lambda old: {
                **old, "published_step": old["step"], "published_release": release_id,
                "releases": _seen(old, release_id, old["step"]),
                "meta": {**(old.get("meta") or {}), "serving": release_id}})
        except ConflictError:
            return None

    # ------------------------------------------------------------------ plumbing

    def _swap(self, scenario: str, expected: Any, change: Any, *, fence: Fence = None,
              token: int | None = None) -> LineageHead:
        sdir = self.dir_of(scenario)
        sdir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(sdir / ".lock"))
        try:
            with lock, (fence or nullcontext)():
                path = sdir / HEAD_FILE
                try:
                    old = _read_head(path)
                    if old is not None:
                        self._head_of(scenario, path, old)  # every field readable
                except StoreError:
                    if expected is not ...:
                        raise
                    old = None  # a reset that names no head replaces an unreadable one
                if expected is not ... and (old["id"] if old else None) != expected:
                    raise ConflictError(f"the lineage of {scenario!r} moved: expected head {expected or 'none'}, "
                                        f"found {old['id'] if old else 'none'}; nothing changed")
                written_by = (old or {}).get("lease_token")
                if token is not None and written_by is not None and int(written_by) > int(token):
                    raise LeaseLost(f"the lineage of {scenario!r} was moved under growth lease token {written_by}, "
                                    f"newer than this step's {token}; nothing changed")
                new = change(old)
                if token is not None:
                    new["lease_token"] = int(token)
                tmp = sdir / f".{HEAD_FILE}.tmp"
                with open(tmp, "w") as f:
                    json.dump(new, f, indent=2, sort_keys=True)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
                _fsync_dir(sdir)
                self._collect(sdir, keep=new.get("checkpoint"))
        finally:
            lock.close()
        return self.head(scenario)  # type: ignore[return-value]

    @staticmethod
    def _collect(sdir: Path, keep: str | None) -> None:
        """Remove every step but the head's (older heads and a killed step's leftovers)."""
        steps = sdir / STEPS_DIR
        if steps.is_dir():
            for entry in steps.iterdir():
                if entry.name != keep:
                    shutil.rmtree(entry, ignore_errors=True)


def describe(state_dir: str | Path, scenario: str) -> dict[str, Any]:
    """What ``reef lineage`` and ``GET /reef/scenarios/{s}/lineage`` show: the head (None
    without a lineage) with its step, the steps since the last publish (how far the lineage is
    ahead of what serves: the policy lag of the traffic it learns from), the last reset."""
    head = Lineages(state_dir).head(scenario)
    return {"scenario": scenario, "head": head.to_dict() if head else None}


def lineage_of(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """The lineage head a candidate is a snapshot of (``metadata["lineage"]``: ``head``,
    ``step``), or None for a candidate of a recipe without a lineage."""
    found = (metadata or {}).get("lineage")
    return found if isinstance(found, dict) and found.get("head") else None


def note_published(state_dir: str | Path, candidate: Any, release_id: str) -> None:
    """After ``candidate`` was published as ``release_id``: its lineage continues from it."""
    found = lineage_of(candidate.metadata)
    if found is not None:
        Lineages(state_dir).note_published(candidate.scenario, str(found["head"]), release_id)


def regression(evaluation: Any) -> str | None:
    """Why the gate's evaluation shows the candidate significantly *worse* than serving (its
    interval entirely below −margin), or None. The divergence guard's test."""
    metrics = getattr(evaluation, "metrics", None) or {}
    interval = metrics.get("interval")
    if not (isinstance(interval, (list, tuple)) and len(interval) == 2):
        return None
    low, high = (float(x) for x in interval)
    margin = abs(float(metrics.get("margin") or 0.0))
    if not high < -margin:
        return None
    confidence = float(metrics.get("confidence") or 0.95) * 100
    return (f"the gate found the lineage head significantly worse than serving: {confidence:g}% interval "
            f"[{low:+.3f}, {high:+.3f}] entirely below -{margin:g}")


def guard_divergence(state_dir: str | Path, candidate: Any, evaluation: Any, serving: str | None, *,
                     fence: Fence = None, token: int | None = None) -> str | None:
    """The divergence guard, after the gate did not publish ``candidate`` (a lineage's snapshot):
    when it found it significantly worse than serving, reset the lineage to the serving release
    ``serving`` (only if the head is still that snapshot, inside the step's lease ``fence``) and
    say why in the candidate's metadata (``lineage.reset``). The reason, or None when nothing
    was reset."""
    found = lineage_of(candidate.metadata)
    reason = regression(evaluation) if found is not None else None
    if reason is None:
        return None
    try:
        Lineages(state_dir).reset(candidate.scenario, to_release=serving, reason=reason, expected=str(found["head"]),
                                  fence=fence, token=token)
    except ConflictError:  # the lineage moved on (or the lease did): that head is judged by its own candidate
        return None
    found["reset"] = reason
    return reason


def _carried(old: dict[str, Any] | None) -> dict[str, Any]:
    keys = ("last_reset", "published_step", "published_release", "releases", "lease_token")
    return {k: old.get(k) for k in keys} if old else {}


#: releases whose lineage step a head remembers (the policy lag of older rollouts is counted
#: from the lineage's start)
RELEASES_KEPT = 64


def _seen(old: dict[str, Any] | None, release_id: str | None, step: int, *, keep: bool = False) -> dict[str, int]:
    """The head's {release id: the lineage step whose state it serves} with ``release_id`` at
    ``step`` (``keep``: only if not known yet); "" is serving the base model."""
    releases = dict((old or {}).get("releases") or {})
    key = release_id or ""
    if not (keep and key in releases):
        releases.pop(key, None)
        releases[key] = int(step)
    return dict(list(releases.items())[-RELEASES_KEPT:])


def _read_head(path: Path) -> dict[str, Any] | None:
    """``HEAD.json`` as a dict, None when there is none; ``StoreError`` when it cannot be read."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise _unreadable(path, str(exc)) from None
    if not isinstance(data, dict):
        raise _unreadable(path, "not a JSON object")
    return data


def _unreadable(path: Path, why: str) -> StoreError:
    return StoreError(f"the learner lineage head {path} cannot be read ({why}); `reef lineage reset "
                      f"{_scenario_of(path)}` starts the lineage again from the serving release")


def _scenario_of(path: Path) -> str:
    from urllib.parse import unquote

    return unquote(path.parent.name)


def _new_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + os.urandom(4).hex()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_@" else f"%{ord(c):02X}" for c in name) or "%"


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
