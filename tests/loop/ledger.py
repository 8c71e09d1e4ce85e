"""A test recipe for the crash and conflict tests: each candidate appends one line per report
of its batch (``- <report id>``) to the current release's ``harness/rules.md``. The head
release's ledger therefore lists every report a published candidate consumed, once per
consumption: a report consumed twice shows up twice, a lost one not at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reef_core.contracts import Recipe
from reef_core.types import Candidate

#: ``python -c`` code that registers this recipe and runs the ``reef`` CLI on ``sys.argv[1:]``
LAUNCHER = (
    "import sys\n"
    "from reef_core.plugins import Registered, get_plugins\n"
    "from tests.loop.ledger import Ledger\n"
    "get_plugins().registry['recipe']['ledger'] = Registered('recipe', 'ledger', Ledger, 'tests')\n"
    "from reef_core.cli import main\n"
    "main(sys.argv[1:])\n"
)


class Ledger(Recipe):
    update_target = "harness"
    filters = ()
    default_evaluator = "always"

    def __init__(self, batch_size: int = 1):
        self.batch_size = batch_size

    def propose(self, batch: Any, current: Any, ctx: Any) -> Candidate:
        art = ctx.new_artifact()
        rules = art / "harness" / "rules.md"
        rules.parent.mkdir(exist_ok=True)
        before = rules.read_text() if rules.is_file() else ""
        rules.write_text(before + "".join(f"- {e.report_id}\n" for e in batch))
        return Candidate(scenario=batch.scenario, recipe="ledger", artifact_dir=art,
                         summary=f"{len(batch)} report(s)")


def ledger_of(release_dir: Path | None) -> list[str]:
    """The report ids a served release's ledger lists, in order (with repeats)."""
    if release_dir is None or not (release_dir / "harness" / "rules.md").is_file():
        return []
    return [line[2:] for line in (release_dir / "harness" / "rules.md").read_text().splitlines()
            if line.startswith("- rpt")]
