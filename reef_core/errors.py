"""The error hierarchy users and plugin authors see.

``ReefError`` subclasses carry a sentence meant for a person; the CLI prints it on one
line and exits with ``exit_code``; the server maps them to JSON error bodies.
"""

from __future__ import annotations


class ReefError(Exception):
    """Base of every error Reef raises on purpose."""

    exit_code = 1


class ConfigError(ReefError):
    """The configuration is invalid: an unknown key, a wrong type, an unknown plugin name."""

    exit_code = 2


class PluginError(ReefError):
    """A plugin failed to import or registered something invalid."""

    exit_code = 2


class StartupError(ReefError):
    """The server could not start: a runtime, the release chain or a plugin failed while starting.

    The message names what failed and what to do about it; the CLI prints it on one line.
    """

    exit_code = 2


class ModelNotFound(ReefError):
    """A request names a model that is neither served nor a configured alias (404 ``model_not_found``).

    ``served`` holds the names a client may use instead (served models, then aliases).
    """

    def __init__(self, model: str, served: list[str]):
        shown = ", ".join(served[:20]) + (f" and {len(served) - 20} more" if len(served) > 20 else "")
        super().__init__(f"model {model[:200]!r} is not served here; use one of: {shown or '(none)'} "
                         f"(GET /v1/models lists them; runtime.model_aliases maps other names)")
        self.model = model
        self.served = served


class StoreError(ReefError):
    """The record store refused an operation."""


class ConflictError(StoreError):
    """A write conflicts with what is stored (same id, other content; stale head)."""


class NotFoundError(StoreError):
    """A referenced object does not exist."""


class RuntimeCallError(ReefError):
    """The model runtime answered with an error.

    ``status`` is the HTTP status to relay; ``body`` the provider-shaped error body, when
    the runtime gave one; ``headers`` the response headers to relay with it (``retry-after``
    of a 429 or 503, which clients' retries wait on).
    """

    def __init__(self, message: str, *, status: int = 502, body: dict | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.body = body
        self.headers = headers


class RuntimeUnavailable(RuntimeCallError):
    """The runtime could not be reached at all (connection refused, DNS, timeout)."""

    def __init__(self, message: str):
        super().__init__(message, status=502)


class PublishConflict(ConflictError):
    """A publisher's expected head is stale: another release moved the chain first."""


class StepStopped(ReefError):
    """A growth step was stopped part-way because its process is stopping (``RecipeContext.stopping``):
    nothing of it is kept."""


def describe_error(exc: BaseException) -> str:
    """One short line for a failed write or a store that went away, safe whatever the exception holds.

    Database errors echo the statement's parameters (the record's whole body) in ``str()``;
    formatting those can itself raise (``RecursionError`` on deeply nested values) or flood
    the log. Only the exception's type and the first line of its message, cut short, are kept.
    """
    try:
        orig = getattr(exc, "orig", None)  # SQLAlchemy wraps the driver's error
        text = str(orig if orig is not None else exc)
    except BaseException:  # noqa: BLE001 - a message that cannot even be formatted
        text = ""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first[:300]}" if first else type(exc).__name__
