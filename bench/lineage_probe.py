"""The held-out accuracy of a learner's lineage head: the learning the gate has not (yet) let through.

A weight recipe's lineage (docs/learning.md, "The learner lineage") trains on through rejected
and undecided candidates and is never served, so the server's chat endpoint cannot measure it.
The bench measures it itself, after the seed's servers stopped (so nothing else competes for the
cores): the same local runtime the servers use, in this process, decodes the held-out tasks
greedily with the head's adapter, exactly as the runtime decodes a candidate under evaluation
(a release on the call), and the recipe's grader scores the answers.

Only for the local runtime: behind ``--endpoint`` there are no weights to put an adapter on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learning_tasks import RecipeBench, Task

from reef_core.types import ActiveRelease, InferenceCall


@dataclass(frozen=True)
class LineageSnapshot:
    """What the learner server said of its lineage before it stopped."""

    step: int
    steps_since_publish: int
    checkpoint: Path | None
    #: the last reset, as ``reef lineage`` gives it: ``"at step N: REASON"`` (None: never reset)
    last_reset: str | None = None

    @classmethod
    def from_response(cls, body: dict[str, Any]) -> LineageSnapshot | None:
        head = body.get("head")
        if not head:
            return None
        checkpoint, reset = head.get("checkpoint"), head.get("last_reset")
        return cls(step=int(head.get("step") or 0), steps_since_publish=int(head.get("steps_since_publish") or 0),
                   checkpoint=Path(checkpoint) if checkpoint else None,
                   last_reset=f"at step {reset.get('step', '?')}: {reset.get('reason') or 'no reason given'}"
                   if reset else None)


def lineage_accuracy(snapshot: LineageSnapshot | None, bench: RecipeBench, tasks: list[Task],
                     scenario: str) -> float | None:
    """Greedy held-out accuracy of the lineage head's adapter, or None when there is nothing to
    measure (no lineage, or a head just reset to serving, which has no checkpoint of its own).
    ``bench``: what grades an answer (``grade(answer, task)``) and its ``max_tokens`` — a
    ``RecipeBench``, or the session bench's ``SessionBench``."""
    if snapshot is None or snapshot.checkpoint is None or not (snapshot.checkpoint / "adapter").is_dir():
        return None
    return asyncio.run(_accuracy(snapshot.checkpoint, bench, tasks, scenario))


async def _accuracy(checkpoint: Path, bench: RecipeBench, tasks: list[Task], scenario: str) -> float:
    from reef_torch.runtime import LocalRuntime

    runtime = LocalRuntime()
    await runtime.start()
    release = ActiveRelease(scenario=scenario, release_id=f"lineage-{checkpoint.name}", path=checkpoint)
    try:
        async def one(i: int, task: Task) -> float:
            call = InferenceCall(scenario=scenario, record_id=f"lineage-probe-{i}", release=release,
                                 body={"model": runtime.model_id,
                                       "messages": [{"role": "user", "content": task.prompt}],
                                       "temperature": 0.0, "max_tokens": bench.max_tokens})
            answer = await runtime.complete(call)
            return bench.grade(answer["choices"][0]["message"]["content"], task)

        scores = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
    finally:
        await runtime.aclose()
    return sum(scores) / len(scores)
