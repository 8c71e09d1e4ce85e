"""How the session bench (``bench/learning_sessions.py``) grades a reply, and the learner's gate built on it.

The student passes a session when the first reply has the hidden style (at most ``max_words``
words, no AI-style markup) **and** its last integer is the sum. The learner's gate is the
``task_suite`` evaluator on prompts of held-out sessions (problems no training session asks),
graded by the same test written as one regex (the ``regex`` grader: ``re.search`` with DOTALL),
so the server needs no bench plugin and the gate and the student cannot disagree
(``tests/test_learning_sessions.py`` checks that they agree on any reply).

Also here: what a seed's loop did, read from the server (candidate counts by outcome and the
learner lineage's head), for any bench that reports it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from learning_tasks import Grader, Task

#: AI-style markup the student refuses: bold, headers, list items, ``\boxed``, "final answer"
MARKDOWN = r"\*\*|__|^\s*#|^\s*[-*+]\s|^\s*\d+[.)]\s|\\boxed|final answer"
_MARKDOWN = re.compile(MARKDOWN, re.MULTILINE | re.IGNORECASE)


@dataclass(frozen=True)
class PlainAndShort:
    """The hidden style: at most ``max_words`` words (``str.split``) and no ``MARKDOWN``."""

    max_words: int

    def __call__(self, reply: str) -> bool:
        return len(reply.split()) <= self.max_words and not _MARKDOWN.search(reply)

    def pattern(self) -> str:
        """The same test as lookaheads from the start of the reply (flags ``i``, ``m``, ``s`` set
        inline by ``pass_pattern``). A word is a whitespace run's complement, each word taken
        whole (``\\S+`` then whitespace or the end), so counting cannot backtrack into a word."""
        return rf"(?!.*?(?:{MARKDOWN}))(?=\s*(?:\S+(?:\s+|\Z)){{0,{self.max_words}}}\Z)"


def pass_pattern(style: PlainAndShort, correct: Grader, task: Task) -> str:
    """A regex that ``re.search`` (DOTALL) finds in a reply exactly when the session passes:
    ``style`` holds and ``correct`` grades the reply 1. ``correct``'s pattern must set no
    flags of its own (global inline flags may only open a pattern)."""
    return rf"(?ims)\A{style.pattern()}(?=.*?(?:{correct.pattern(task)}))"


def gate_tasks_config(tasks: list[Task], style: PlainAndShort, correct: Grader) -> list[dict[str, Any]]:
    """The gate's tasks as ``task_suite`` takes them: each held-out session's first prompt and the
    pass test as a regex."""
    return [{"id": t.id, "prompt": t.prompt, "pattern": pass_pattern(style, correct, t), "grader": "regex"}
            for t in tasks]


# ------------------------------------------------------------------ what the loop did

#: candidate statuses a table counts on their own; the rest (proposed, evaluating, error, ...) as "other"
OUTCOMES = ("published", "rejected", "undecided")


@dataclass(frozen=True)
class LoopOutcome:
    """A seed's candidates by outcome, the gate's word on each (``verdicts``, oldest first) and
    its learner lineage's head step (None: no lineage)."""

    candidates: Mapping[str, int]
    lineage_step: int | None = None
    steps_since_publish: int | None = None
    verdicts: tuple[str, ...] = ()

    def count(self, status: str) -> int:
        if status == "other":
            return sum(n for s, n in self.candidates.items() if s not in OUTCOMES)
        return int(self.candidates.get(status, 0))

    def brief(self) -> str:
        others = sorted(s for s in self.candidates if s not in OUTCOMES)
        lineage = ("no lineage" if self.lineage_step is None
                   else f"lineage step {self.lineage_step} ({self.steps_since_publish} since the last publish)")
        return (f"published {self.count('published')}, rejected {self.count('rejected')}, undecided "
                f"{self.count('undecided')}, other {self.count('other')}"
                + (f" ({', '.join(f'{s} {self.candidates[s]}' for s in others)})" if others else "")
                + f"; {lineage}")


def verdict(row: Mapping[str, Any]) -> str:
    """One candidate in a line: its status, the lineage step it is a snapshot of and the reports
    it trained on, and, once a ``task_suite`` gate measured it, both sides' mean, the
    improvement's interval and the rounds it took."""
    m = (row.get("evaluation") or {}).get("metrics") or {}
    line = f"{row.get('id', '?')} {row.get('status')}"  # whole: ids of one run share their first 20 characters
    artifact = row.get("artifact") or {}
    snapshot = ((artifact.get("metadata") or {}).get("lineage") or {}) if isinstance(artifact, Mapping) else {}
    if "step" in snapshot:
        line += f" (lineage step {snapshot['step']}, {artifact.get('reports', '?')} report(s))"
    if "improvement" in m and "interval" in m:
        low, high = m["interval"]
        line += (f": candidate {m.get('candidate_mean', float('nan')):.3f} vs serving "
                 f"{m.get('current_mean', float('nan')):.3f}, improvement {m['improvement']:+.3f} "
                 f"[{low:+.3f}, {high:+.3f}] after {m.get('rounds', 1)} of {m.get('max_rounds', 1)} round(s)")
    return line


def loop_outcome(server: Any, scenario: str) -> LoopOutcome:
    """What ``server``'s loop did (``server.http``: an httpx client of a ``bench/learning.py``
    ``ReefProcess``): ``GET /reef/scenarios/{s}/candidates`` and ``GET /reef/scenarios/{s}/lineage``."""
    rows = server.http.get(f"/reef/scenarios/{scenario}/candidates", params={"limit": 1000}).raise_for_status()
    rows = sorted(rows.json()["candidates"], key=lambda r: str(r.get("created_at") or ""))
    head = (server.http.get(f"/reef/scenarios/{scenario}/lineage").raise_for_status().json() or {}).get("head")
    return LoopOutcome(dict(Counter(str(r.get("status")) for r in rows)),
                       lineage_step=head["step"] if head else None,
                       steps_since_publish=head.get("steps_since_publish") if head else None,
                       verdicts=tuple(verdict(r) for r in rows))
