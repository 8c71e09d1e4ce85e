"""The running kernel: one object that owns settings, plugins, the store, the runtime and
what each scenario serves.

The server (``reef_core.serve``) reads from it on the request path. Serving releases is the
kernel's own service (``reef.releases``); the learning loop (Observe → Grow → Commit) is an
optional in-process plugin that ``reef_core.compose.build_reef`` attaches (``reef.learning``).
Every event goes through pluggy: the installed plugins' hooks, then the hooks of in-process
plugins registered on this kernel with ``reef.register``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pluggy

from . import hookspecs
from .commit.serving import ServingReleases
from .config import Settings, mask_secrets, parse_model_aliases
from .errors import ConfigError, ModelNotFound, PluginError, ReefError, StartupError
from .plugins import Plugins, instantiate
from .protocols import conform
from .runtime import Runtime
from .store import RecordStore
from .types import ActiveRelease, PublishedRelease, StoredReport

if TYPE_CHECKING:
    from .grow import LearningLoop

log = logging.getLogger("reef")


class Reef:
    """Settings, plugins, record store, runtime, and what each scenario serves now.

    ``background=False`` is for one-shot use (the CLI): no follower of releases published
    elsewhere, and an attached learning loop runs no workers or schedule.
    """

    #: the kernel's settings (``reef_core.config.Settings``)
    settings: Settings
    #: the installed plugins (registries per kind and their pluggy hooks)
    plugins: Plugins
    #: the record store (records, reports, candidates, releases)
    store: RecordStore
    #: the configured runtime, conformed to ``reef_core.contracts.Runtime``
    runtime: Runtime
    #: the release chain and the serving table (``reef_core.commit.serving``)
    releases: ServingReleases
    #: the learning loop when one is attached (``reef_core.compose.build_reef``), else None
    learning: LearningLoop | None

    def __init__(self, settings: Settings, plugins: Plugins, *, store: RecordStore | None = None,
                 runtime: Runtime | None = None, background: bool = True):
        self.settings = settings
        self.plugins = plugins
        self.background = background
        self.state_dir = settings.state_dir
        self.state_dir.mkdir(parents=True, exist_ok=True)
        #: client model name → served model name (``runtime.model_aliases``), for any runtime
        self.model_aliases = parse_model_aliases(settings.runtime.get("model_aliases"))
        name, options = settings.group("runtime")
        self.runtime_name = name
        self.learning = None
        #: in-process plugins of this kernel only (``register``); installed plugins live in ``plugins``
        self._local = pluggy.PluginManager("reef")
        self._local.add_hookspecs(hookspecs)
        self._own_store = store is None
        if store is None:
            with _startup_step(f"the record store {mask_secrets(settings.record_store_url)} could not be opened"):
                store = settings.open_record_store()
        self.store = store
        try:
            if runtime is None:
                with _startup_step(f"runtime {name!r} could not be built"):
                    runtime = self.build("runtime", name, options)
            self.runtime = conform("runtime", runtime)
            self._check_aliases(list(runtime.models()))  # again at start, when the served names are complete
            store_name, store_options = settings.group("artifact_store")
            with _startup_step(f"artifact store {store_name!r} could not be set up"):
                self.releases = ServingReleases(artifacts=self.build("artifact_store", store_name, store_options),
                                                store=store, runtime=self.runtime, state_dir=self.state_dir,
                                                on_published=self._published)
        except BaseException:
            self.close_unstarted()
            raise
        #: the served names, read from the runtime once it has started (None before)
        self._served: frozenset[str] | None = None
        self._served_list: list[str] = []
        #: True between a successful ``start()`` and ``stop()``
        self.started = False
        self._started_plugins: list[tuple[str, Any]] = []

    def build(self, kind: str, name: str, options: dict[str, Any], *, prefix: str | None = None) -> Any:
        """Instantiate the registered ``kind`` ``name`` with ``options`` (checked against its
        constructor) and the kernel services it declares (``state_dir``, ``store``,
        ``settings``, ``plugins``): the one place the kernel builds plugin objects."""
        services: dict[str, Any] = {"state_dir": self.state_dir, "settings": self.settings}
        if hasattr(self, "store"):
            services["store"] = self.store
        return instantiate(kind, name, options, self.plugins, prefix=prefix, **services)

    def close_unstarted(self) -> None:
        """Release what the constructor opened (the record store it opened itself) when the
        kernel will never start, e.g. because composing the app failed."""
        if self._own_store and hasattr(self, "store"):
            self.store.close()

    # ------------------------------------------------------------------ in-process plugins and events

    def register(self, plugin: Any, name: str | None = None) -> None:
        """Register an in-process plugin for this kernel only: an object whose ``@hookimpl``
        methods implement lifecycle (``startup``, ``shutdown``) or observer hooks. The
        learning loop and the scenario registry are registered so; tests register recorders."""
        self._local.register(plugin, name=name)

    def unregister(self, plugin: Any) -> None:
        self._local.unregister(plugin)

    def _hooks(self, event: str) -> list[Any]:
        return [getattr(self.plugins.hook, event), getattr(self._local.hook, event)]

    def observed(self, event: str) -> bool:
        """Whether any plugin observes ``event`` (emitters skip building the observers'
        read-only copies when nobody does)."""
        return any(hook.get_hookimpls() for hook in self._hooks(event))

    def emit(self, event: str, **kwargs: Any) -> None:
        """Tell observers that something became durable (``record_stored``, ``report_stored``,
        ``candidate_evaluated``, ``release_published``) with read-only values, never store rows
        (the emitters build them). Observer errors are logged, never raised: an integration must
        not fail a request."""
        for hook in self._hooks(event):
            if not hook.get_hookimpls():
                continue
            try:
                hook(**kwargs)
            except Exception:
                log.exception("observer hook %s failed", event)

    def store_report(self, scenario: str, references: list[str], *, score: float | None = None,
                     feedback: Any = None, metadata: dict[str, Any] | None = None,
                     report_id: str | None = None) -> tuple[StoredReport, bool]:
        """Store a report as ``POST /reef/report`` does and tell observers when it is new
        (``report_stored``, which wakes the scenario's learning): for plugins that compute
        feedback from traffic instead of receiving it. Blocking (call it from a thread).

        ``report_id`` makes it idempotent (same id and body: the stored report, ``created``
        False; other body: ``ConflictError``); a reference that is no record of ``scenario`` is a
        ``NotFoundError``. Returns ``(the stored report, created)``."""
        from .store import RecordStore, Report, new_id

        content = {"score": score, "feedback": feedback, "references": list(references), "metadata": metadata}
        row = Report(id=report_id or new_id("rpt"), scenario=scenario, score=score, feedback=feedback,
                     references=list(references), meta=metadata,
                     body_hash=RecordStore.report_body_hash({"scenario": scenario, **content}))
        stored, created = self.store.add_report(row)
        report = StoredReport.from_row(stored)
        if created:
            self.emit("report_stored", report=report)
        return report, created

    def _published(self, row: Any) -> None:
        if self.observed("release_published"):
            self.emit("release_published", release=PublishedRelease.from_row(row))

    # ------------------------------------------------------------------ serving state

    def serving_release(self, scenario: str) -> ActiveRelease | None:
        """The release ``scenario`` serves now (frozen into each record at request start)."""
        return self.releases.serving(scenario)

    def prepare_body(self, scenario: str, body: dict[str, Any], dialect: str,
                     release: ActiveRelease | None) -> dict[str, Any]:
        """Apply the scenario's serving harness (system prompt, rules, skills) to a request body.

        Returns the body to send and record. Without a harness release it is returned as is.
        """
        return self.releases.apply_harness(body, dialect, release)

    def top_logprobs(self, scenario: str) -> int:
        """How many most likely tokens per response token the runtime records for ``scenario``'s
        traffic (``InferenceCall.top_logprobs``): what its recipe asks for (``Recipe.top_logprobs``),
        0 without a learning loop."""
        return self.learning.top_logprobs(scenario) if self.learning is not None else 0

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
        """Start the runtime (load the model, open connections), serve every scenario's head
        release, then run the plugins' ``startup`` hooks.

        A failure is a ``StartupError`` (or the ``ConfigError``/``PluginError`` raised) naming
        what failed; what had started is stopped again before it propagates, so a failed start
        leaves nothing running. Calling it on a started kernel does nothing.
        """
        if self.started:
            return
        try:
            await _start_step(f"runtime {self.runtime_name!r} failed to start", self.runtime.start())
            served = list(self.runtime.models())
            self._check_aliases(served)
            self._served = frozenset(served)
            self._served_list = served
            await _start_step("the release chain could not be recovered and served",
                              self.releases.start(follow=self.background))
            for plugin_name, impl in self._impls("startup"):
                self._started_plugins.append((plugin_name, impl.plugin))
                await _start_step(f"plugin {plugin_name!r} failed to start", _maybe_await(impl.function(reef=self)))
        except BaseException:
            await self._unwind()
            raise
        self.started = True

    def _impls(self, hook: str) -> list[tuple[str, Any]]:
        """(plugin name, hookimpl) of ``hook``: installed plugins first, then this kernel's own,
        each in registration order."""
        found = []
        for pm in (self.plugins.pm, self._local):
            for impl in getattr(pm.hook, hook).get_hookimpls():
                found.append((impl.plugin_name, impl))
        return found

    async def _shutdown_plugins(self, *, quiet: bool) -> None:
        started = {id(plugin) for _, plugin in self._started_plugins}
        for plugin_name, impl in reversed(self._impls("shutdown")):
            if id(impl.plugin) not in started:
                continue
            try:
                await _maybe_await(impl.function(reef=self))
            except Exception:  # shutdown continues whatever one plugin does
                if quiet:
                    log.debug("error while stopping plugin %r after a failed start", plugin_name, exc_info=True)
                else:
                    log.exception("error while stopping plugin %r", plugin_name)
        self._started_plugins.clear()

    async def _unwind(self) -> None:
        """Stop what a failed ``start()`` may have started; failures here are only logged."""
        await self._shutdown_plugins(quiet=True)
        try:
            await self.releases.stop()
            await self.runtime.aclose()
        except Exception:
            log.debug("error while closing the runtime after a failed start", exc_info=True)

    async def stop(self) -> None:
        self.started = False
        await self._shutdown_plugins(quiet=False)
        await self.releases.stop()
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


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value

