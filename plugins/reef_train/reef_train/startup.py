"""The start-up check every weight recipe makes in a Reef server: refuse, before the first
request, a runtime training cannot reach (``upstream``, ``sglang`` without
``runtime.base_model_path``), in one line naming the recipe and the runtime (exit 2).

This is the one module that uses reef-core, and only when called from a server's ``startup``
hook: the rest of reef-train installs and runs without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def refuse_untrainable_runtime(reef: Any, recipe: str, *, exempt: Callable[[Mapping[str, Any]], bool] | None = None,
                               note: str = "") -> bool:
    """In a ``startup`` hook: whether ``reef`` learns with ``recipe`` (False: not this recipe, or
    no learning, or ``exempt(options)`` says this configuration trains nothing), after checking
    that its runtime offers ``reef_core.TrainableBase``; a ``ConfigError`` naming the recipe and
    the configured runtime (and ``note``) when it does not."""
    from reef_core import ConfigError, require_trainable

    if reef.learning is None:
        return False
    name, options = reef.settings.group("recipe")
    if name != recipe or (exempt is not None and exempt(options or {})):
        return False
    try:
        require_trainable(reef.runtime, recipe)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (configured: runtime={reef.settings.group('runtime')[0]}{note})") from None
    return True
