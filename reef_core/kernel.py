"""The running kernel: one object that owns settings, plugins, the store and the runtime.

The server (``reef_core.serve``) reads from it on the request path; the learning loop
(Observe → Grow → Commit) updates what each scenario serves through ``set_serving``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .config import Settings
from .plugins import Plugins, instantiate
from .runtime import Runtime
from .store import RecordStore
from .types import ActiveRelease

log = logging.getLogger("reef")


class Reef:
    """Settings, plugins, record store, runtime, and what each scenario serves now."""

    def __init__(self, settings: Settings, plugins: Plugins, *, store: RecordStore | None = None,
                 runtime: Runtime | None = None):
        self.settings = settings
        self.plugins = plugins
        self.state_dir = settings.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = store or settings.open_record_store()
        name, options = settings.group("runtime")
        self.runtime_name = name
        self.runtime: Runtime = runtime or instantiate(
            "runtime", name, options, plugins, state_dir=self.state_dir, settings=settings
        )
        self._serving: dict[str, ActiveRelease] = {}
        self._serving_lock = asyncio.Lock()
        #: extensions set by the learning side (harness injection, start/stop hooks)
        self.extensions: dict[str, Any] = {}
        #: in-process listeners per observer event, called after the plugins' observer hooks
        self.listeners: dict[str, list[Callable[..., Any]]] = {}
        from .learning import install_learning

        install_learning(self)

    def emit(self, event: str, **kwargs: Any) -> None:
        """Tell observers that something became durable (``record_stored``, ``report_stored``,
        ``candidate_evaluated``, ``release_published``). Observer errors are logged, never raised:
        an integration must not fail a request."""
        try:
            getattr(self.plugins.hook, event)(**kwargs)
        except Exception:
            log.exception("observer hook %s failed", event)
        for listener in self.listeners.get(event, []):
            try:
                listener(**kwargs)
            except Exception:
                log.exception("listener for %s failed", event)

    # ------------------------------------------------------------------ serving state

    def serving_release(self, scenario: str) -> ActiveRelease | None:
        """The release ``scenario`` serves now (frozen into each record at request start)."""
        return self._serving.get(scenario)

    async def set_serving(self, release: ActiveRelease) -> None:
        """Activate ``release`` in the runtime, then route new requests to it (hot swap)."""
        async with self._serving_lock:
            await self.runtime.activate(release)
            self._serving[release.scenario] = release

    def prepare_body(self, scenario: str, body: dict[str, Any], dialect: str,
                     release: ActiveRelease | None) -> dict[str, Any]:
        """Apply the scenario's serving harness (system prompt, rules, skills) to a request body.

        Returns the body to send and record. Without a harness release it is returned as is.
        """
        apply = self.extensions.get("apply_harness")
        if apply is None or release is None:
            return body
        return apply(body, dialect, release)

    def scenario_settings(self, scenario: str):
        return self.settings.scenarios.get(scenario)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.runtime.start()
        for hook in self.extensions.get("on_start", []):
            await hook(self)

    async def stop(self) -> None:
        for hook in reversed(self.extensions.get("on_stop", [])):
            try:
                await hook(self)
            except Exception:  # shutdown continues whatever one extension does
                log.exception("error while stopping an extension")
        await self.runtime.aclose()
        self.store.close()
