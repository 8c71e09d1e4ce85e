"""Growth steps started from the dashboard, and what the pages show of a running step.

``POST /ui/scenarios/{s}/grow`` starts the step as a task of the server's event loop (the
learning loop's own ``grow``, the same call ``POST /reef/scenarios/{s}/grow`` makes) with a
``TrackedProgress``: the recipe's and evaluator's progress bars (``ctx.progress``) are kept for
the page and still logged as the server logs them. The page polls ``.../progress`` about
every second while a step runs; a step started by the loop itself (a report, the schedule)
shows as running too, without bars.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from fastapi import Request

from ..errors import ConflictError
from ..grow.progress import LogProgress, ProgressTask

log = logging.getLogger("reef.ui")


class TrackedProgress:
    """``ctx.progress`` for a dashboard step: log lines as usual, and every task's description,
    total and completed count for the page (``snapshot``; safe from any thread)."""

    def __init__(self, scenario: str):
        self._log = LogProgress(logging.getLogger("reef.progress"), label=scenario)
        self._lock = threading.Lock()
        self._tasks: list[dict[str, Any]] = []

    @contextmanager
    def task(self, description: str, total: int | None = None) -> Iterator[ProgressTask]:
        entry = {"description": description, "total": total, "completed": 0, "done": False}
        with self._lock:
            self._tasks.append(entry)
        with self._log.task(description, total) as logged:
            def advanced(done: int) -> None:
                with self._lock:
                    entry["completed"] = done
                logged.advance()

            try:
                yield ProgressTask(advanced)
            finally:
                with self._lock:
                    entry["done"] = True

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(t) for t in self._tasks]


@dataclass
class Growth:
    """A step started from the dashboard: its task, progress, and result once it ends."""

    scenario: str
    progress: TrackedProgress
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    task: asyncio.Task | None = None
    result: dict[str, Any] | None = None
    error: str | None = None

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


def _growths(request: Request) -> dict[str, Growth]:
    state = request.app.state
    if getattr(state, "ui_growth", None) is None:
        state.ui_growth = {}
    return state.ui_growth


def start_growth(request: Request, loop: Any, scenario: str) -> Growth:
    """Start a growth step of ``scenario`` in the background, unless one runs already (then
    that one is returned)."""
    growths = _growths(request)
    current = growths.get(scenario)
    if current is not None and current.running:
        return current
    growth = Growth(scenario=scenario, progress=TrackedProgress(scenario))

    async def run() -> None:
        try:
            result = await loop.grow(scenario, growth.progress)
            growth.result = result.to_dict()
        except ConflictError as exc:  # the mode changed to one that learns nothing meanwhile
            growth.error = str(exc)
        except Exception as exc:  # the page says what happened; the log has the details
            log.exception("growth step of %s started from the dashboard failed", scenario)
            growth.error = f"the growth step failed: {type(exc).__name__}: {exc}"

    growth.task = asyncio.create_task(run(), name=f"reef-ui-grow-{scenario}")
    growths[scenario] = growth
    return growth


def growth_view(request: Request, scenario: str, loop_status: dict[str, Any] | None) -> dict[str, Any]:
    """What the progress panel shows: whether a step runs, its bars, and the last result."""
    growth = _growths(request).get(scenario)
    loop_running = bool(loop_status and loop_status.get("state") == "running")
    running = bool(growth and growth.running) or loop_running
    last = (growth.result if growth and growth.result else None) or (loop_status or {}).get("last_step")
    return {
        "running": running,
        "automatic": loop_running and not (growth and growth.running),
        "tasks": growth.progress.snapshot() if growth and growth.running else [],
        "started_at": growth.started_at if growth else None,
        "error": growth.error if growth and not growth.running else None,
        "last": last,
    }


def scenario_mode(detail: dict[str, Any]) -> str | None:
    """The scenario's learning mode as the loop reports it (None when the loop has no modes)."""
    loop = detail.get("loop") or {}
    mode = loop.get("mode")
    return str(mode) if mode is not None else None
