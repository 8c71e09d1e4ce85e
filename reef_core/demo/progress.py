"""How ``reef demo`` shows its progress: a live table on a terminal, plain lines elsewhere.

On a terminal, rich's ``Live`` redraws the progress bars, the latest answers and the loop's
state. Anywhere else (a pipe, a CI log, ``nohup``) ``Live`` would print nothing until the run
ends, ten minutes later, so ``LineProgress`` writes one flushed line per phase, per round and
per candidate published or rejected instead. ``run_demo`` drives either through the same calls.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table


@dataclass
class Turn:
    user: str
    question: str
    answer: str
    score: float
    release: str | None


def _short(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


class DemoProgress(ABC):
    """What the demo reports as it runs (``with progress:`` around the run). The base keeps the
    state both views show: the latest turns, the loop's state and the candidates' counts."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.loop: dict[str, Any] = {}
        self.counts: Counter = Counter()

    def __enter__(self) -> DemoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @abstractmethod
    def phase(self, label: str, total: int | None = None) -> Any:
        """A phase starts (``total`` steps, None: unknown); returns its handle."""

    def advance(self, phase: Any) -> None:
        """One step of ``phase`` is done (called from the demo's worker threads)."""

    def finish(self, phase: Any) -> None:
        """``phase`` is done."""

    def round_done(self, number: int, rounds: int, turns: list[Turn]) -> None:
        self.turns.extend(turns)

    def observe(self, loop: dict[str, Any], candidates: list[dict[str, Any]]) -> None:
        """The loop's state and the candidates, as the server reports them now."""
        self.loop = loop
        self.counts = Counter(c["status"] for c in candidates)


class LiveProgress(DemoProgress):
    """The terminal's view: progress bars, the latest answers and the loop, redrawn by ``Live``."""

    def __init__(self, console: Console):
        super().__init__()
        self.console = console
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console)
        self._live = Live(self, console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveProgress:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(*exc)

    def phase(self, label: str, total: int | None = None) -> TaskID:
        return self.progress.add_task(label, total=total)

    def advance(self, phase: TaskID) -> None:
        self.progress.advance(phase)

    def finish(self, phase: TaskID) -> None:
        self.progress.update(phase, total=1, completed=1)

    def __rich__(self) -> Group:
        table = Table(title="latest answers", expand=True, title_justify="left")
        table.add_column("user", no_wrap=True)
        table.add_column("question", ratio=2)
        table.add_column("answer", ratio=3)
        table.add_column("score", justify="right")
        for t in self.turns[-8:]:
            style = "green" if t.score >= 1.0 else "red"
            table.add_row(t.user, t.question, _short(t.answer, 90), f"[{style}]{t.score:.0f}[/{style}]")
        loop = (f"loop: {self.loop.get('state', '?')}, {self.loop.get('eligible', 0)} report(s) eligible; "
                f"candidates: {self.counts.get('published', 0)} published, {self.counts.get('rejected', 0)} rejected, "
                f"{self.counts.get('undecided', 0)} undecided; "
                f"serving: {self.loop.get('serving_release_id') or 'base (no release yet)'}")
        return Group(self.progress, table, loop)


class LineProgress(DemoProgress):
    """The view for a pipe or a log: one flushed line per phase, per round of traffic and per
    candidate published, rejected or left undecided, each with the seconds since the demo started."""

    def __init__(self, stream: TextIO, clock: Any = time.monotonic):
        super().__init__()
        self.stream = stream
        self.clock = clock
        self.start = clock()
        self.decided: set[str] = set()
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock:
            self.stream.write(f"[{self.clock() - self.start:5.0f}s] {text}\n")
            self.stream.flush()

    def phase(self, label: str, total: int | None = None) -> str:
        self.line(label + (f" ({total})" if total is not None else "") + " …")
        return label

    def round_done(self, number: int, rounds: int, turns: list[Turn]) -> None:
        super().round_done(number, rounds, turns)
        score = sum(t.score for t in turns) / len(turns) if turns else 0.0
        self.line(f"round {number}/{rounds}: {len(turns)} answers graded and reported, mean score {score:.2f}")

    def observe(self, loop: dict[str, Any], candidates: list[dict[str, Any]]) -> None:
        super().observe(loop, candidates)
        for c in sorted(candidates, key=lambda c: c.get("created_at") or ""):
            if c["status"] not in ("published", "rejected", "undecided") or c["id"] in self.decided:
                continue
            self.decided.add(c["id"])
            if c["status"] == "published":
                what = f"published as {c.get('release_id') or '?'}"
                detail = c.get("summary")
            else:  # rejected, or undecided: the gate's evidence decided neither way within its cap
                what, detail = c["status"], c.get("reason") or c.get("summary")
            self.line(f"candidate {c['id']} {what}" + (f": {_short(detail, 160)}" if detail else ""))


def demo_progress(console: Console) -> DemoProgress:
    """The live table when ``console`` writes to a terminal, plain lines otherwise."""
    return LiveProgress(console) if console.is_terminal else LineProgress(console.file)
