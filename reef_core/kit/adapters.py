"""Which adapter version each scenario serves, and when an old version may be unloaded.

Pure bookkeeping shared by the runtimes that hot-swap adapters (``reef-torch``,
``reef-sglang``): a *version* is one release of one scenario, named ``<scenario>@<release_id>`` when it carries a LoRA adapter
(``None`` means the base model). A request *holds* the version it started on until it
leaves the batch; activating a new release retires the old version, which is unloaded once
its last hold is released. Everything happens under one lock, so the switch is atomic:
a request either got the old version (and keeps it) or the new one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..types import BASE_RELEASE_ID, ActiveRelease

BASE = None


def version_name(scenario: str, release_id: str) -> str:
    """The versioned adapter name for a release: ``<scenario>@<release_id>``."""
    return f"{scenario}@{release_id}"


@dataclass
class Version:
    """One adapter version of a scenario and how many requests hold it (mutated under the table's lock only)."""

    scenario: str
    release_id: str | None
    adapter: str | None  # versioned adapter name, or None for the base model
    holds: int = 0
    retired: bool = False


class AdapterTable:
    """Thread-safe map scenario → serving version, with per-version hold counts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[str, Version] = {}
        self._versions: dict[tuple[str, str | None], Version] = {}

    def acquire(self, scenario: str) -> Version:
        """Hold the scenario's active version (the base model if none was activated)."""
        with self._lock:
            version = self._active.get(scenario)
            if version is None:
                version = self._versions.setdefault((scenario, None), Version(scenario, None, BASE))
                self._active[scenario] = version
            version.holds += 1
            return version

    def hold_for_call(self, scenario: str, release: ActiveRelease | None) -> Version | None:
        """Hold the version a call runs on, or None when the call's release must be loaded first.

        The release on the call (frozen by the server at request start, or a candidate under
        evaluation) wins when it belongs to ``scenario``; without one, the scenario's active
        version serves. None means the named release is not resident: the runtime loads it
        and calls ``hold_transient``.
        """
        if release is None or release.scenario != scenario:
            return self.acquire(scenario)
        if release.release_id == BASE_RELEASE_ID:
            return self._hold_base(scenario)
        return self.acquire_exact(scenario, release.release_id)

    def _hold_base(self, scenario: str) -> Version:
        """Hold the base model for ``scenario`` whatever it serves (``base_release``): nothing to load."""
        with self._lock:
            version = self._versions.get((scenario, None))
            if version is None:  # what serves when nothing was activated, else a version for such calls alone
                version = self._versions[(scenario, None)] = Version(scenario, None, BASE, retired=scenario in self._active)
            self._active.setdefault(scenario, version)
            version.holds += 1
            return version

    def acquire_exact(self, scenario: str, release_id: str) -> Version | None:
        """Hold the version of exactly ``release_id`` if it is resident, else None."""
        with self._lock:
            version = self._versions.get((scenario, release_id))
            if version is not None:
                version.holds += 1
            return version

    def hold_transient(self, scenario: str, release_id: str, adapter: str | None) -> Version:
        """Register and hold a version that serves only the requests holding it.

        For a release that is not the active one: a candidate being evaluated, or a release
        swapped out after the server froze it for a request. It starts retired, so its adapter
        is unloaded as soon as the last request holding it leaves.
        """
        with self._lock:
            key = (scenario, release_id)
            version = self._versions.get(key)
            if version is None:
                version = self._versions[key] = Version(scenario, release_id, adapter, retired=True)
            version.holds += 1
            return version

    def release(self, version: Version) -> list[str]:
        """Drop one hold; return adapter names that are now unused and must be unloaded."""
        with self._lock:
            version.holds -= 1
            return self._collect(version)

    def activate(self, scenario: str, release_id: str, adapter: str | None) -> list[str]:
        """Make ``(release_id, adapter)`` the scenario's serving version; return adapters to unload."""
        with self._lock:
            key = (scenario, release_id)
            version = self._versions.get(key)
            if version is None:
                version = self._versions[key] = Version(scenario, release_id, adapter)
            version.retired = False
            old = self._active.get(scenario)
            self._active[scenario] = version
            if old is None or old is version:
                return []
            old.retired = True
            return self._collect(old)

    def active(self, scenario: str) -> Version | None:
        """The scenario's serving version, or None before anything was acquired or activated."""
        with self._lock:
            return self._active.get(scenario)

    def is_loaded(self, adapter: str) -> bool:
        """Whether ``adapter`` is still resident (active somewhere or draining)."""
        with self._lock:
            return any(v.adapter == adapter for v in self._versions.values())

    def snapshot(self) -> dict[str, dict]:
        """Scenario → ``{release_id, adapter}`` served now, plus draining versions' holds."""
        with self._lock:
            out: dict[str, dict] = {
                s: {"release_id": v.release_id, "adapter": v.adapter, "holds": v.holds} for s, v in self._active.items()
            }
            out["_draining"] = {
                v.adapter or f"{v.scenario}@{v.release_id}:base": v.holds for v in self._versions.values() if v.retired
            }
            return out

    def _collect(self, version: Version) -> list[str]:
        if not version.retired or version.holds > 0:
            return []
        self._versions.pop((version.scenario, version.release_id), None)
        if version.adapter is None or any(v.adapter == version.adapter for v in self._versions.values()):
            return []
        return [version.adapter]


__all__ = ["BASE", "AdapterTable", "Version", "version_name"]
