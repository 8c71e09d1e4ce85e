"""Test plugins for stopping a server in the middle of a growth step: a recipe whose step runs
until it is told to stop (``deaf``: never looks), or proposes at once, and a gate that calls the
model until it is cancelled. Each appends what happened (``start``, ``stopped``, ``refused``,
``cancelled``) to ``log``, one word a line, so a test can see where the step was."""

from __future__ import annotations

import time
from typing import Any

from reef_core.contracts import Evaluator
from reef_core.types import Candidate, Decision, Evaluation

#: ``python -c`` code that registers these plugins and runs the ``reef`` CLI on ``sys.argv[1:]``
LAUNCHER = (
    "import sys\n"
    "from reef_core.plugins import Registered, get_plugins\n"
    "from tests.loop.long_step import LongGate, LongStep\n"
    "registry = get_plugins().registry\n"
    "registry['recipe']['long_step'] = Registered('recipe', 'long_step', LongStep, 'tests')\n"
    "registry['evaluator']['long_gate'] = Registered('evaluator', 'long_gate', LongGate, 'tests')\n"
    "from reef_core.cli import main\n"
    "main(sys.argv[1:])\n"
)


def _write(log: str, what: str) -> None:
    with open(log, "a", encoding="utf-8") as f:
        f.write(what + "\n")


class LongStep:
    """``propose``: ``train`` runs for ``seconds`` (a training step that looks at
    ``ctx.stopping``, unless ``deaf``), ``propose`` returns a harness candidate at once."""

    update_target = "harness"
    filters = ()
    default_evaluator = "long_gate"

    def __init__(self, batch_size: int = 1, log: str = "", mode: str = "train", seconds: float = 600.0,
                 deaf: bool = False):
        self.batch_size = int(batch_size)
        self.log, self.mode, self.seconds, self.deaf = log, mode, float(seconds), bool(deaf)

    def propose(self, batch: Any, current: Any, ctx: Any) -> Candidate | None:
        _write(self.log, "start")
        if self.mode == "propose":
            art = ctx.new_artifact()
            (art / "harness").mkdir(exist_ok=True)
            (art / "harness" / "rules.md").write_text("- Be brief.\n")
            return Candidate(scenario=batch.scenario, recipe="long_step", artifact_dir=art, summary="a rule")
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            if self.deaf:
                time.sleep(0.05)
            elif ctx.stopping.wait(0.05):
                _write(self.log, "stopped")
                try:
                    with ctx.fence():  # where a lineage would move its head
                        _write(self.log, "fenced")
                except Exception as exc:  # noqa: BLE001 - the refusal is what the test looks for
                    _write(self.log, f"refused {type(exc).__name__}")
                    raise
        return None


class LongGate(Evaluator):
    """Calls the model (through the step's context) until the evaluation is cancelled."""

    timeout_s = 600.0

    def __init__(self, log: str = ""):
        self.log = log

    def evaluate(self, candidate: Candidate, current: Any, ctx: Any) -> Evaluation:
        _write(self.log, "gate")
        body = {"model": ctx.default_model, "messages": [{"role": "user", "content": "Is it good?"}]}
        try:
            while True:
                ctx.complete(body, current)
        except Exception as exc:
            _write(self.log, f"cancelled {type(exc).__name__}")
            raise

    def decide(self, evaluation: Evaluation) -> Decision:
        return Decision("select", "long_gate selects whatever it finished")
