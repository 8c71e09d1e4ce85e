"""The runtime contract: how the server hands a model call to whatever serves the model.

A runtime speaks one provider dialect (``openai`` or ``anthropic``); the server translates
client bodies into it before the call and translates answers back. Runtimes are registered
through ``register_runtimes`` and built with ``cls(**options)`` from the ``runtime`` config
group (``state_dir`` is passed when the constructor declares it).

Model names: ``models()`` says which names a request may carry (see there); the kernel
rejects others before the runtime is called, so a runtime sees only served names, or any
name when it declares none (a pass-through proxy).

Errors: raise ``reef_core.errors.RuntimeCallError(message, status=..., body=...)`` for an
answer that is an error (relayed with its status), ``RuntimeUnavailable`` when the model
cannot be reached (502). A constructor or ``start()`` that cannot work as configured should
raise ``ConfigError`` or ``StartupError`` with one sentence naming the fix: ``reef serve``
prints it as one line and exits 2 (any other exception is reported with its type the same way).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any

from .types import ActiveRelease, InferenceCall


class Runtime(ABC):
    """Base class for runtimes; subclasses override ``complete`` and ``stream``."""

    #: the provider dialect of the bodies this runtime takes and returns
    dialect: str = "openai"

    async def start(self) -> None:
        """Open connections or load models; called once before serving (before the port is bound)."""

    @abstractmethod
    async def complete(self, call: InferenceCall) -> dict[str, Any]:
        """Answer a non-streamed request: return the provider response body."""

    @abstractmethod
    def stream(self, call: InferenceCall) -> AsyncIterator[dict[str, Any]]:
        """Answer a streamed request: yield provider stream events as dicts.

        OpenAI dialect: ``chat.completion.chunk`` objects (the server writes ``data: [DONE]``).
        Anthropic dialect: event objects with their ``type`` (``message_start`` …
        ``message_stop``); the server writes the SSE ``event:`` line from ``type``.
        """

    async def activate(self, release: ActiveRelease) -> None:
        """Make ``release`` the one serving ``release.scenario`` (hot swap; no restart).

        Requests already running finish on what they started with. Runtimes without
        weights (an HTTP upstream) need do nothing: harness releases are applied by the
        server itself.
        """

    def models(self) -> list[str]:
        """The model names a request may name; ``GET /v1/models`` lists them (with the aliases).

        The kernel answers a request naming another model with 404 ``model_not_found``, unless
        ``runtime.model_aliases`` maps that name to one of these (the body then names the
        served model). A request without ``model`` is the runtime's to answer with its default.

        An empty list means "any name is passed through": the runtime forwards to a backend
        whose models it cannot know (the ``upstream`` runtime with neither ``model`` nor
        ``model_map``), and the backend answers unknown names itself. The list must be
        complete once ``start()`` has returned (the kernel reads it then, once); before that it
        may be empty or partial, e.g. when the name is discovered from the backend at start.
        """
        return []

    async def aclose(self) -> None:
        """Release connections, threads and models."""
