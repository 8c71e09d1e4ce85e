"""The runtime contract: how the server hands a model call to whatever serves the model.

A runtime speaks one provider dialect (``openai`` or ``anthropic``); the server translates
client bodies into it before the call and translates answers back. Runtimes are registered
through ``register_runtimes`` and built with ``cls(**options)`` from the ``runtime`` config
group (``state_dir`` is passed when the constructor declares it).

Errors: raise ``reef_core.errors.RuntimeCallError(message, status=..., body=...)`` for an
answer that is an error (relayed with its status), ``RuntimeUnavailable`` when the model
cannot be reached (502).
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
        """Open connections or load models; called once before serving."""

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
        """Model ids this runtime serves, for ``GET /v1/models``."""
        return []

    async def aclose(self) -> None:
        """Release connections, threads and models."""
