"""The runtime contract, kept importable from here: ``reef_core.runtime.Runtime`` is
``reef_core.contracts.Runtime`` (see there for the members, defaults and error conventions)."""

from __future__ import annotations

from .contracts import Runtime

__all__ = ["Runtime"]
