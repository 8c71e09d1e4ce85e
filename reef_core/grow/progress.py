"""Progress reporting for recipes and evaluators: a rich bar in the CLI, log lines in the server.

Both implement the same small interface::

    with ctx.progress.task("evaluating", total=len(tasks)) as bar:
        ...
        bar.advance()
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ProgressTask:
    """One unit of progress; ``advance`` is thread-safe."""

    def __init__(self, on_advance):
        self._on_advance = on_advance
        self._lock = threading.Lock()
        self.completed = 0

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.completed += n
            done = self.completed
        self._on_advance(done)


class LogProgress:
    """Progress as log lines (at most about ten per task), for server-side growth."""

    def __init__(self, logger: logging.Logger, label: str = ""):
        self.log = logger
        self.label = label

    @contextmanager
    def task(self, description: str, total: int | None = None) -> Iterator[ProgressTask]:
        if self.label:
            description = f"{self.label}: {description}"
        step = max((total or 0) // 10, 1)
        self.log.info("%s: started%s", description, f" ({total} steps)" if total else "")

        def on_advance(done: int) -> None:
            if total and (done % step == 0 or done == total):
                self.log.info("%s: %d/%d", description, done, total)

        yield ProgressTask(on_advance)
        self.log.info("%s: done", description)


class RichProgress:
    """Progress as a rich progress bar, for ``reef grow``."""

    def __init__(self, console=None):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=console, transient=False)

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    @contextmanager
    def task(self, description: str, total: int | None = None) -> Iterator[ProgressTask]:
        task_id = self._progress.add_task(description, total=total)
        yield ProgressTask(lambda done: self._progress.update(task_id, completed=done))
        self._progress.update(task_id, completed=total or 0, total=total)
