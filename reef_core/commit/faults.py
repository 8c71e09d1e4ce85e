"""Test hook: kill the process at a named step of a growth step's publish sequence.

``REEF_FAULT_AT=<step>`` makes a process SIGKILL itself right after it completes ``<step>``,
so tests can check that whoever takes the scenario over next leaves every report consumed
exactly once and the chain and its table agreeing. What a crash after each step leaves
behind, and how it is recovered, is listed in ``reef_core.grow.step``.
"""

from __future__ import annotations

import os
import signal

#: the environment variable naming the step to die after
FAULT_ENV = "REEF_FAULT_AT"

#: the publish sequence of a growth step, in order (``reef_core.grow.step`` says what each leaves)
PUBLISH_STEPS = (
    "consumed",             # the batch is held by a new candidate row (status proposed)
    "evaluating",           # the proposal is staged, the candidate is evaluating
    "selected",             # the gate's verdict (select) is stored
    "fenced",               # the lease row is locked and checked; the git compare-and-swap is next
    "git_published",        # the artifact store's ref moved: the commit point
    "served",               # this process serves the release; its row is not written yet
    "release_recorded",     # the releases row is written; the candidate is not marked yet
    "candidate_published",  # the candidate is marked published; only the lease is left to release
)


def fault_point(step: str) -> None:
    """Die here when ``REEF_FAULT_AT`` names ``step`` (a no-op otherwise)."""
    if step not in PUBLISH_STEPS:  # the tests kill at each listed step: none may go untested
        raise ValueError(f"{step!r} is not one of the publish steps {PUBLISH_STEPS}")
    if os.environ.get(FAULT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)
