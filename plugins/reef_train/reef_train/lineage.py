"""A weight recipe's steps on its scenario's learner lineage (``reef_core.commit.lineage``):
where a step's learner starts, and how the step advances the lineage.

Like ``startup``, this module uses reef-core (when called, so reef-train still imports without
it) and is not re-exported by ``reef_train``: only a recipe that runs in Reef calls it.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoint import ADAPTER_DIR, LEARNER_DIR, read_learner_state

if TYPE_CHECKING:
    from reef_core import LineageHead, Lineages


def lineages_in(state_dir: str | Path | None) -> Lineages:
    """The lineages of the server's state directory (None, e.g. a recipe built in a test or a
    bench without one: a temporary directory, gone with the process)."""
    from reef_core import Lineages

    return Lineages(Path(state_dir) if state_dir is not None else Path(tempfile.mkdtemp(prefix="reef-lineage-")))


def fencing(ctx: Any) -> dict[str, Any]:
    """The growth lease a step's lineage moves under (``RecipeContext.fence`` and
    ``lease_token``; nothing for a context without them, e.g. a bench's)."""
    fence = getattr(ctx, "fence", None)
    return {"fence": fence, "token": getattr(ctx, "lease_token", None)} if fence is not None else {}


def continued_head(lineages: Lineages, scenario: str, current: Any, log: logging.Logger,
                   ctx: Any = None) -> LineageHead | None:
    """The scenario's lineage head, checked against serving (``current``): it continues from the
    release that served when it was written or from its own published snapshot (the content
    hashes match; that publish is noted); serving anything else (a rollback, another server's
    release) resets it to the serving release, and the head that says so is returned."""
    head = lineages.head(scenario)
    if head is None or head.checkpoint is None:
        return head
    serving = current.release_id if current is not None else None
    if head.meta.get("serving") == serving:
        return head
    if current is not None and current.content_hash and current.content_hash == head.meta.get("artifact_hash"):
        return lineages.note_published(scenario, head.id, current.release_id) or lineages.head(scenario)
    reason = (f"serving moved to {serving or 'the base model'}, which is not this lineage's snapshot "
              f"(a rollback, or a release from another server)")
    log.warning("lineage of %r reset at step %d: %s", scenario, head.step, reason)
    return lineages.reset(scenario, to_release=serving, reason=reason, expected=head.id, **fencing(ctx))


def learner_source(head: LineageHead | None, current: Any, runtime: Any,
                   recipe: str) -> tuple[Path | None, Path | None, str]:
    """(adapter, learner state, where they come from) for ``recipe``'s next step: the lineage
    head's checkpoint, else the serving release's adapter and ``learner/``, else nothing (new)."""
    if head is not None and head.checkpoint is not None and \
            read_learner_state(head.checkpoint / LEARNER_DIR, recipe) is not None:
        adapter = head.checkpoint / ADAPTER_DIR
        return (adapter if adapter.is_dir() else None), head.checkpoint / LEARNER_DIR, f"lineage step {head.step}"
    adapter = runtime.adapter_of(current)
    if current is not None and current.path is not None and \
            read_learner_state(current.path / LEARNER_DIR, recipe) is not None:
        return adapter, current.path / LEARNER_DIR, "the serving release"
    return adapter, None, "new"


def advance(lineages: Lineages, scenario: str, artifact: Path, *, head: LineageHead | None, current: Any,
            steps: int, meta: dict[str, Any], ctx: Any = None) -> LineageHead:
    """Make the step's checkpoint ``artifact`` (``adapter/`` + ``learner/``) the lineage's new
    head, ``steps`` training steps past ``head`` (compare-and-swap on it), under the step's
    growth lease (``ctx``: refused with ``LeaseLost`` when the lease was lost meanwhile);
    ``meta`` joins what the lineage needs to follow serving (the serving release, the
    checkpoint's content hash)."""
    from reef_core import content_hash

    return lineages.advance(scenario, artifact, expected=head.id if head else None, steps=max(int(steps), 1),
                            **fencing(ctx),
                            meta={**meta, "serving": current.release_id if current is not None else None,
                                  "artifact_hash": content_hash(artifact)})


def candidate_metadata(head: LineageHead) -> dict[str, Any]:
    """What a candidate that is a snapshot of ``head`` says about it (``metadata["lineage"]``)."""
    return {"head": head.id, "step": head.step, "steps_since_publish": head.to_dict()["steps_since_publish"]}
