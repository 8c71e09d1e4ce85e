"""A weight recipe's steps on its scenario's learner lineage (``reef_core.commit.lineage``):
where a step's learner starts, and how the step advances the lineage.

Like ``startup``, this module uses reef-core (when called, so reef-train still imports without
it) and is not re-exported by ``reef_train``: only a recipe that runs in Reef calls it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoint import ADAPTER_DIR, LEARNER_DIR, read_learner_state

if TYPE_CHECKING:
    from reef_core import LineageHead, Lineages


#: the weight recipes' default ``max_staleness``: lineage steps a rollout's sampling release may
#: be behind the head before the rollout is dropped (docs/learning.md says why 64)
MAX_STALENESS = 64


def lineages_in(state_dir: str | Path | None) -> Lineages:
    """The lineages of the server's state directory (None, e.g. a recipe built in a test or a
    bench without one: a temporary directory, gone with the process)."""
    from reef_core import Lineages

    if state_dir is not None:
        return Lineages(Path(state_dir))
    root = tempfile.mkdtemp(prefix="reef-lineage-")
    lineages = Lineages(Path(root))
    # removed when the lineages are collected, or at the latest when the interpreter exits
    weakref.finalize(lineages, shutil.rmtree, root, True)
    return lineages


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


def lag_of(head: LineageHead | None, release_id: str | None) -> int:
    """The policy lag, in lineage steps, of a rollout sampled from ``release_id`` (0 without a head)."""
    return head.lag(release_id) if head is not None else 0


def keep_up(lineages: Lineages, scenario: str, head: LineageHead | None, current: Any, max_staleness: int,
            log: logging.Logger, ctx: Any = None) -> tuple[LineageHead | None, str | None]:
    """(the head to train, why it was reset or None). When what serves is more than
    ``max_staleness`` lineage steps behind the head — the lineage ran that far ahead without a
    publish — every rollout the traffic brings is too stale to train on, so the lineage could
    never move again: it resets to the serving release's state (the gate saw each of those
    snapshots and let none through)."""
    if head is None or head.checkpoint is None:
        return head, None
    serving = current.release_id if current is not None else None
    behind = head.lag(serving)
    if behind <= max_staleness:
        return head, None
    reason = (f"the lineage ran {behind} steps ahead of the serving release ({serving or 'the base model'}) without "
              f"a publish, more than max_staleness {max_staleness}: what serves samples rollouts too stale to train "
              "it on")
    log.warning("lineage of %r reset at step %d: %s", scenario, head.step, reason)
    return lineages.reset(scenario, to_release=serving, reason=reason, expected=head.id, **fencing(ctx)), reason


def kl_bound(ctx: Any) -> float | None:
    """The divergence guard's KL bound (``loop.lineage_max_kl``; None: no bound, or no settings)."""
    loop = getattr(getattr(ctx, "settings", None), "loop", None)
    return getattr(loop, "lineage_max_kl", None)


def guard_kl(lineages: Lineages, scenario: str, head: LineageHead, current: Any, kl: float | None,
             bound: float | None, log: logging.Logger, ctx: Any = None) -> str | None:
    """The divergence guard on the KL bound: when the KL of the step's new ``head`` to serving on
    the step's rollouts (``train_step``'s ``kl``) passes ``bound``, reset the lineage to the
    serving release's state (only if ``head`` is still the head). Why, or None."""
    if kl is None or bound is None or not kl > bound:
        return None
    serving = current.release_id if current is not None else None
    reason = (f"the lineage head's KL to the serving release ({serving or 'the base model'}) on this step's rollouts "
              f"is {kl:.4g} nats per token, above loop.lineage_max_kl {bound:g}")
    from reef_core import ConflictError

    try:
        lineages.reset(scenario, to_release=serving, reason=reason, expected=head.id, **fencing(ctx))
    except ConflictError:  # the head moved on meanwhile (or the lease did): nothing of ours to reset
        return None
    log.warning("lineage of %r reset at step %d: %s", scenario, head.step, reason)
    return reason


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


def candidate_metadata(head: LineageHead, *, reset: str | None = None, rollouts_stale: int = 0,
                       lags: list[int] | None = None) -> dict[str, Any]:
    """What a candidate that is a snapshot of ``head`` says about it (``metadata["lineage"]``):
    the head, its step and steps since the last publish, the rollouts dropped as stale, the
    policy lag of those it trained on (``lag_max``, ``lag_mean``), and ``reset`` when the step
    reset the lineage (why: ``reef_lineage_resets_total`` counts it)."""
    out: dict[str, Any] = {"head": head.id, "step": head.step,
                           "steps_since_publish": head.to_dict()["steps_since_publish"],
                           "rollouts_stale": int(rollouts_stale)}
    if lags:
        out.update(lag_max=max(lags), lag_mean=sum(lags) / len(lags))
    if reset:
        out["reset"] = reset
    return out
