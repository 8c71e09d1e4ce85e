"""A test evaluator for the multi-server tests: selects every candidate after ``seconds``,
appending ``start``/``end`` lines (pid, candidate id, time) to ``log``, so a test can see which
process is mid-step and check that steps never overlapped."""

from __future__ import annotations

import os
import time
from typing import Any

from reef_core.contracts import Evaluator
from reef_core.types import Candidate, Decision, Evaluation

#: ``python -c`` code that registers this evaluator and runs the ``reef`` CLI on ``sys.argv[1:]``
LAUNCHER = (
    "import sys\n"
    "from reef_core.plugins import Registered, get_plugins\n"
    "from tests.loop.slow_gate import SlowGate\n"
    "get_plugins().registry['evaluator']['slow_gate'] = Registered('evaluator', 'slow_gate', SlowGate, 'tests')\n"
    "from reef_core.cli import main\n"
    "main(sys.argv[1:])\n"
)


class SlowGate(Evaluator):
    timeout_s = 120.0

    def __init__(self, seconds: float = 2.0, log: str = ""):
        self.seconds = float(seconds)
        self.log = log

    def _write(self, what: str, candidate: Candidate) -> None:
        with open(self.log, "a", encoding="utf-8") as f:
            f.write(f"{what} {os.getpid()} {candidate.id} {time.time():.6f}\n")

    def evaluate(self, candidate: Candidate, current: Any, ctx: Any) -> Evaluation:
        self._write("start", candidate)
        time.sleep(self.seconds)
        self._write("end", candidate)
        return Evaluation(evaluator="slow_gate")

    def decide(self, evaluation: Evaluation) -> Decision:
        return Decision("select", "slow_gate selects every candidate")


def gate_runs(log: str) -> dict[str, dict[str, Any]]:
    """{candidate id: {"pid", "start", "end" (None while running)}} from the gate's log."""
    runs: dict[str, dict[str, Any]] = {}
    try:
        lines = open(log, encoding="utf-8").read().splitlines()
    except FileNotFoundError:
        return runs
    for line in lines:
        what, pid, cid, ts = line.split()
        run = runs.setdefault(cid, {"pid": int(pid), "start": None, "end": None})
        run[what] = float(ts)
    return runs
