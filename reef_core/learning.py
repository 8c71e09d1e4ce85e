"""Wiring of the learning loop (Observe → Grow → Commit) into a running kernel.

Observe lives in ``reef_core.observe`` (experience, filters), Grow in ``reef_core.grow``
(workers, recipe context, the step), Commit in ``reef_core.commit`` (gate, release chain,
harness). This module only attaches them to the kernel's extension points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kernel import Reef


def install_learning(reef: Reef) -> None:
    """Attach the loop's workers, release chain and harness injection to ``reef``.

    Sets ``reef.extensions``: ``learning`` (the ``LearningLoop``), ``apply_harness``
    (server-side harness injection, cached per release), ``scenario_status`` (loop state for
    the scenario route), ``on_start``/``on_stop`` hooks; and listens to ``report_stored``
    so a full batch triggers growth.
    """
    from .grow import LearningLoop

    loop = LearningLoop(reef)
    reef.extensions["learning"] = loop
    reef.extensions["apply_harness"] = loop.harness.apply
    reef.extensions["scenario_status"] = loop.status
    reef.extensions.setdefault("on_start", []).append(loop.start)
    reef.extensions.setdefault("on_stop", []).append(loop.stop)
    reef.listeners.setdefault("report_stored", []).append(loop.on_report_stored)
