"""The running kernel: one object that owns settings, plugins, the store and the runtime.

The server (``reef_core.serve``) reads from it on the request path; the learning loop
(Observe → Grow → Commit) updates what each scenario serves through ``set_serving``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .config import Settings, mask_secrets, parse_model_aliases
from .errors import ConfigError, ModelNotFound, PluginError, ReefError, StartupError
from .plugins import Plugins, instantiate
from .protocols import conform
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
        #: client model name → served model name (``runtime.model_aliases``), for any runtime
        self.model_aliases = parse_model_aliases(settings.runtime.get("model_aliases"))
        name, options = settings.group("runtime")
        self.runtime_name = name
        own_store = store is None
        if store is None:
            with _startup_step(f"the record store {mask_secrets(settings.record_store_url)} could not be opened"):
                store = settings.open_record_store()
        self.store = store
        try:
            if runtime is None:
                with _startup_step(f"runtime {name!r} could not be built"):
                    runtime = instantiate("runtime", name, options, plugins, state_dir=self.state_dir,
                                          settings=settings)
            self.runtime: Runtime = conform("runtime", runtime)
            self._check_aliases(list(runtime.models()))  # again at start, when the served names are complete
        except BaseException:
            if own_store:
                store.close()
            raise
        #: the served names, read from the runtime once it has started (None before)
        self._served: frozenset[str] | None = None
        self._served_list: list[str] = []
        #: True between a successful ``start()`` and ``stop()``
        self.started = False
        self._serving: dict[str, ActiveRelease] = {}
        self._serving_lock = asyncio.Lock()
        #: extensions set by the learning side (harness injection, start/stop hooks)
        self.extensions: dict[str, Any] = {}
        #: in-process listeners per observer event, called after the plugins' observer hooks
        self.listeners: dict[str, list[Callable[..., Any]]] = {}
        from .learning import install_learning

        with _startup_step("the learning loop could not be set up"):
            install_learning(self)

    def observed(self, event: str) -> bool:
        """Whether a plugin hook or an in-process listener observes ``event`` (emitters skip building
        the observers' read-only copies when nobody does)."""
        return bool(self.listeners.get(event)) or bool(getattr(self.plugins.hook, event).get_hookimpls())

    def emit(self, event: str, **kwargs: Any) -> None:
        """Tell observers that something became durable (``record_stored``, ``report_stored``,
        ``candidate_evaluated``, ``release_published``) with read-only values, never store rows
        (the emitters build them). Observer errors are logged, never raised: an integration must
        not fail a request."""
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

    # ------------------------------------------------------------------ model names

    def served_models(self) -> list[str]:
        """The names the runtime serves; empty when it passes any name through (see ``Runtime.models``)."""
        return list(self._served_list) if self._served is not None else list(self.runtime.models())

    def model_names(self) -> list[str]:
        """What a client may name: the served models, then the aliases (``GET /v1/models``)."""
        served = self.served_models()
        return served + [alias for alias in self.model_aliases if alias not in served]

    def resolve_model(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body to serve: an alias replaced by the model it names; a name nobody serves refused.

        A body without ``model`` is returned as is (the runtime answers with its default), and
        so is any name when the runtime passes names through. Raises ``ModelNotFound`` (404
        ``model_not_found``) listing what a client may name instead.
        """
        name = body.get("model")
        if name is None:
            return body
        if not isinstance(name, str):
            raise ModelNotFound(repr(name), self.model_names())
        target = self.model_aliases.get(name)
        if target is not None:
            return body if target == name else {**body, "model": target}
        served = self._served if self._served is not None else self.runtime.models()
        if not served or name in served:
            return body
        raise ModelNotFound(name, self.model_names())

    def _check_aliases(self, served: list[str]) -> None:
        """Every alias must name a served model (checkable only when the runtime lists them)."""
        if not served:
            return
        for alias, target in self.model_aliases.items():
            if target not in served:
                raise ConfigError(f"runtime.model_aliases maps {alias!r} to {target!r}, which runtime "
                                  f"{self.runtime_name!r} does not serve (it serves: {', '.join(served)})")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the runtime (load the model, open connections), then the extensions.

        A failure is a ``StartupError`` (or the ``ConfigError``/``PluginError`` raised) naming
        what failed; the runtime and the extensions are stopped again before it propagates,
        so a failed start leaves nothing running. Calling it on a started kernel does nothing.
        """
        if self.started:
            return
        try:
            await _start_step(f"runtime {self.runtime_name!r} failed to start", self.runtime.start())
            served = list(self.runtime.models())
            self._check_aliases(served)
            self._served = frozenset(served)
            self._served_list = served
            for hook in self.extensions.get("on_start", []):
                await _start_step(f"{_hook_name(hook)} failed to start", hook(self))
        except BaseException:
            await self._unwind()
            raise
        self.started = True

    async def _unwind(self) -> None:
        """Stop what a failed ``start()`` may have started; failures here are only logged."""
        for hook in reversed(self.extensions.get("on_stop", [])):
            try:
                await hook(self)
            except Exception:
                log.debug("error while stopping an extension after a failed start", exc_info=True)
        try:
            await self.runtime.aclose()
        except Exception:
            log.debug("error while closing the runtime after a failed start", exc_info=True)

    async def stop(self) -> None:
        self.started = False
        for hook in reversed(self.extensions.get("on_stop", [])):
            try:
                await hook(self)
            except Exception:  # shutdown continues whatever one extension does
                log.exception("error while stopping an extension")
        await self.runtime.aclose()
        self.store.close()


# ---------------------------------------------------------------------- helpers

_DEBUG_HINT = "(run with server.log_level=debug for the traceback)"


def startup_error(what: str, exc: BaseException) -> ReefError:
    """``exc``, raised while starting, as one line for a person: ``<what>: <cause>``.

    Configuration and plugin errors pass unchanged (they already name the key or plugin and
    exit 2); any other Reef error keeps its sentence after ``what``; a foreign exception adds
    its type and a pointer to the traceback, since its message was not written for a person.
    """
    if isinstance(exc, (ConfigError, PluginError)):
        return exc
    if isinstance(exc, ReefError):
        return StartupError(f"{what}: {_one_line(exc)}")
    return StartupError(f"{what}: {type(exc).__name__}: {_one_line(exc)} {_DEBUG_HINT}")


def _one_line(exc: BaseException, limit: int = 600) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    return text if len(text) <= limit else text[:limit - 1] + "…"


@contextmanager
def _startup_step(what: str) -> Iterator[None]:
    """Turn a failure of the ``with`` block into ``startup_error(what, exc)``."""
    try:
        yield
    except Exception as exc:
        error = startup_error(what, exc)
        if error is exc:
            raise
        raise error from exc


async def _start_step(what: str, step: Awaitable[Any]) -> None:
    with _startup_step(what):
        await step


def _hook_name(hook: Any) -> str:
    owner = getattr(hook, "__self__", None)
    if owner is not None:
        return f"extension {type(owner).__module__}.{type(owner).__qualname__}"
    return f"extension {getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', repr(hook))}"

