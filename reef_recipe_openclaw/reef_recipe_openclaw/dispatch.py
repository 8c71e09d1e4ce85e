"""The dispatch table: what a judged turn trains on.

| hint accepted | eval | outcome       | reward | teachers                              |
|---------------|------|---------------|--------|---------------------------------------|
| yes           | ±1   | ``hint_eval`` | eval   | the hint candidates                   |
| yes           | 0    | ``hint_only`` | 0      | the hint candidates                   |
| no            | ±1   | ``anchor``    | eval   | the anchor: the teacher on the plain prompt |
| no            | 0    | ``retired``   | —      | — (the turn trains nothing)           |

A teacher is the frozen initial model; a hint candidate conditions it on the hint appended to
the last user message. ``None`` in ``teachers`` stands for the anchor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

OUTCOMES = ("hint_eval", "hint_only", "anchor", "retired")


@dataclass(frozen=True)
class Dispatch:
    outcome: str
    reward: float
    teachers: tuple[str | None, ...] = ()

    @property
    def trains(self) -> bool:
        return self.outcome != "retired"


def dispatch(eval_score: int, hints: Sequence[str]) -> Dispatch:
    """The table's row for a turn whose evaluative vote is ``eval_score`` and whose hint
    candidates are ``hints`` (empty: no hint accepted)."""
    if eval_score not in (-1, 0, 1):
        raise ValueError(f"eval_score must be -1, 0 or 1, not {eval_score!r}")
    if hints:
        return Dispatch("hint_eval" if eval_score else "hint_only", float(eval_score), tuple(hints))
    if eval_score:
        return Dispatch("anchor", float(eval_score), (None,))
    return Dispatch("retired", 0.0, ())


@dataclass
class DispatchCounters:
    """How many turns went each way (and why others never reached the table)."""

    counts: Counter = field(default_factory=Counter)

    def add(self, outcome: str, n: int = 1) -> None:
        self.counts[outcome] += n

    def snapshot(self) -> dict[str, int]:
        return {k: int(v) for k, v in sorted(self.counts.items())}
