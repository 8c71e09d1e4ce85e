"""One growth step of one scenario: Observe → Grow → Commit.

1. Observe: the eligible experience (the pool under the scenario's ``PoolRule``, the
   recipe's and config's filters).
2. Consume the batch (``batch_size`` experiences; up to ``max_batches`` whole batches when
   more are eligible, as after a long evaluation) under a fresh candidate (all or nothing, the
   candidate's row in the same transaction), so no record trains two candidates at the same
   time — not in two workers, not across a restart.
3. Grow: ``recipe.propose(batch, current, ctx)`` in a thread. If it raises, the
   experience returns to the pool under the return rule, counting the attempt (an item the
   recipe keeps failing on is spent after ``loop.max_attempts`` instead of coming back at every
   step); if it returns None the batch stays consumed (it taught nothing and must not
   re-trigger forever). A server that stops
   mid-step does not wait for the recipe or the gate to finish (``reef_core.grow.stoppable``):
   they are asked to stop, and the candidate is settled as an interrupted one (below) at once.
4. Commit: the gate evaluates fail-closed; its verdict, the evaluation's episodes and — for a
   rejected, undecided or errored candidate — the return of its experience to the pool are
   one transaction. A recipe that keeps a learner lineage (``Recipe.keeps_lineage``) trained its
   lineage on the batch whatever the verdict, so its experience stays consumed instead. A
   selected candidate is published with the base release as expected head (compare-and-swap)
   and activated in serving; an undecided one (the gate's evidence, up to its cap, decided
   neither way) is not published, like a rejected one, and says so.

Across processes, a step runs only while its process holds the scenario's growth lease
(``reef_core.grow.lease``): the candidate records the lease's fencing token, and the publish
runs under the lease row's lock after checking that token, so a step whose process lost the
lease ends ``fenced`` and never publishes.

The publish sequence, and what a process killed right after each step leaves behind (the
step names are ``reef_core.commit.faults.PUBLISH_STEPS``; ``REEF_FAULT_AT=<step>`` kills there):

==================== =========================================== ===========================
step                 state a kill leaves                         recovered as
==================== =========================================== ===========================
consumed             batch held by a ``proposed`` candidate      interrupted
evaluating           candidate ``evaluating``                    interrupted
selected             candidate ``selected``, nothing published   interrupted
fenced               lease row locked (the transaction dies)     interrupted
git_published        release in the store only; ``selected``     recorded, then published
served               the same (this process served it)           recorded, then published
release_recorded     release row written; ``selected``           published
candidate_published  all written; the lease not released         nothing to repair
==================== =========================================== ===========================

Recovery is the next lease holder's (``reef_core.grow.lease.settle_ended_steps``), with a
newer token, before its own step: first the chain is caught up (``ReleaseChain.catch_up``:
a release the store has and the database lacks is recorded from its manifest and its
candidate marked published), then the unsettled candidates of older holdings are settled:
*published* when a release row names them, else *interrupted* (``error``; the experience
returns to the pool under the return rule, counting the attempt). A published candidate
keeps its batch, so each report is consumed by one published candidate only; the holder
then serves the head and builds on it. A step that loses the compare-and-swap (``conflict``: the head moved under
it) returns its experience the same way and catches the chain up: the batch is back in the
pool at once (the head moved) and the next step (after an automatic one, the worker looks
again at once) retries it on the new head, until ``loop.max_attempts`` is spent.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..commit.chain import stage_candidate
from ..commit.faults import fault_point
from ..commit.gate import run_gate
from ..commit.lineage import guard_divergence, note_published
from ..errors import ConflictError, PublishConflict, ReefError
from ..observe import Batch, eligible
from ..observe.eligibility import pool_rule
from ..store import CandidateRow, LeaseLost, new_id
from ..types import Candidate, Decision, Evaluation
from .context import SKIP_KINDS, RecipeContext, eval_context
from .plan import ScenarioPlan, max_batches
from .stoppable import run_stoppable

if TYPE_CHECKING:
    from ..kernel import Reef
    from .lease import Holding

log = logging.getLogger("reef.grow")

#: ``Evaluation.metrics`` key of a verdict taken over from an earlier candidate with the same
#: artifact and serving release (its id); ``reef_gate_already_decided_total`` counts them
ALREADY_DECIDED = "already_decided"

#: a candidate's status (and the step's outcome) after each decision of the gate
STATUS = {"select": "selected", "reject": "rejected", "undecided": "undecided", "error": "error"}


@dataclass
class StepResult:
    """What a growth step did: ``outcome`` is nothing | busy | skipped | error | rejected |
    undecided | conflict | fenced | published."""

    scenario: str
    trigger: str
    outcome: str
    reason: str = ""
    eligible: int = 0
    candidate_id: str | None = None
    release_id: str | None = None
    evaluation: dict[str, Any] | None = None
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    finished_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def made_progress(self) -> bool:
        """Whether experience was settled (worth checking for another batch right away)."""
        return self.outcome in ("skipped", "rejected", "undecided", "published", "conflict")


def summarize(evaluation: Evaluation, decision: Decision) -> dict[str, Any]:
    """The small evaluation summary kept in a release manifest."""
    keys = ("wins", "losses", "ties", "margin", "candidate_mean", "current_mean", "rounds", "detectable_effect")
    return {"evaluator": evaluation.evaluator, "decision": decision.outcome, "reason": decision.reason,
            "episodes": len(evaluation.candidate_scores),
            **{k: evaluation.metrics[k] for k in keys if k in evaluation.metrics}}


def auto_step_due(reef: Reef, plan: ScenarioPlan) -> bool:
    """Whether an automatic step of ``plan.scenario`` may do anything (blocking): a full batch
    is eligible, or the scenario has unsettled candidates a lease holder may have to settle.
    Checked before taking the lease, so checks that find nothing never take it (across
    servers, each report and schedule tick triggers one)."""
    from .lease import UNSETTLED

    if plan.recipe.update_target == "none":
        return False
    if any(row.scenario == plan.scenario for row in reef.store.candidates_with_status(UNSETTLED)):
        return True
    size = int(plan.recipe.batch_size or 0)
    if size <= 0:
        return False
    items = eligible(reef.store, plan.scenario, list(plan.filters), want=size,
                     rule=pool_rule(reef.settings.loop, size))
    return len(items) >= size


async def run_step(reef: Reef, plan: ScenarioPlan, trigger: str, progress: Any,
                   lease: Holding | None = None) -> StepResult:
    """Run one step of ``plan.scenario`` on ``reef`` (its store, release chain and runtime);
    never raises for what a recipe or evaluator does (the result says). ``lease``: the
    scenario's growth lease the caller holds; publishing is fenced by its token."""
    result = StepResult(scenario=plan.scenario, trigger=trigger, outcome="nothing")
    try:
        await _step(reef, plan, trigger, progress, result, lease)
    finally:
        result.finished_at = datetime.now(timezone.utc).isoformat()
    return result


async def _step(reef: Reef, plan: ScenarioPlan, trigger: str, progress: Any, result: StepResult,
                lease: Holding | None) -> None:
    store, releases = reef.store, reef.releases
    scenario, recipe_name, recipe = plan.scenario, plan.recipe_name, plan.recipe
    if recipe.update_target == "none":
        result.reason = f"recipe {recipe_name!r} records only; it proposes no updates"
        return
    problem = reef.runtime.config_problem()
    if problem:  # before consuming: every episode would fail and the batch would be spent on nothing
        result.outcome = "error"
        result.reason = f"runtime {reef.runtime_name!r} cannot answer (nothing was consumed): {problem}"
        return
    size = int(recipe.batch_size or 0)
    rule = pool_rule(reef.settings.loop, size)
    most = size * max_batches(recipe) if size > 0 else None
    items = await asyncio.to_thread(eligible, store, scenario, list(plan.filters), want=most, rule=rule)
    result.eligible = len(items)
    if not items:
        result.reason = "no eligible experience (reports in the pool passing the filters)"
        return
    if trigger != "manual" and (size <= 0 or len(items) < size):
        result.reason = f"{len(items)} eligible experience(s), batch size is {size}"
        return
    batch = Batch(scenario, items[:whole_batches(len(items), size, most)] if size > 0 else items)

    cid = new_id("cand")
    head = await asyncio.to_thread(releases.chain.head, scenario)
    row = CandidateRow(id=cid, scenario=scenario, recipe=recipe_name, lease_token=lease.token if lease else None,
                       base_release_id=head.release_id if head else None, status="proposed")
    try:  # the batch and the candidate holding it: one transaction
        await asyncio.to_thread(store.consume, cid, scenario, record_ids=batch.record_ids,
                                report_ids=batch.report_ids, candidate=row)
    except ConflictError as exc:
        result.reason = f"the batch was taken by another worker meanwhile ({exc}); nothing done"
        return
    fault_point("consumed")
    result.candidate_id = cid
    scratch_root = reef.state_dir / "scratch"
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{cid}-", dir=scratch_root))
    staged_dir = reef.state_dir / "candidates" / cid
    try:
        current = await releases.current(scenario, head)
        candidate = await _propose(reef, plan, batch, current, row, scratch, staged_dir, progress, result, lease)
        if candidate is None:
            return
        evaluation, decision = await _evaluate(reef, plan, candidate, head, current, row, progress, result, lease)
        if decision.outcome == "select":
            fault_point("selected")
            await _publish(reef, plan, candidate, head, evaluation, decision, result, lease)
    except (Exception, asyncio.CancelledError) as exc:  # whatever broke, the candidate says so, nothing is published
        stopped = isinstance(exc, asyncio.CancelledError)  # the server is stopping
        if stopped:
            reason = "growth step stopped part-way: its process was told to stop (SIGTERM or Ctrl-C)"
            log.warning("%s: candidate %s: %s", scenario, cid, reason)
        else:
            reason = f"growth step failed: {type(exc).__name__}: {exc}"
            log.exception("%s: %s", scenario, reason)
        if row.status == "evaluating":
            # not decided: the experience trained nothing that serves; it returns to the pool
            # under the return rule, and counts as an attempt, so a step that keeps failing
            # here cannot retry it forever
            await _finish(store, row, status="error", decision="error", reason=reason, result=result,
                          return_experience=returned_unless_trained(reef, plan))
        elif row.status == "proposed":
            # nothing was proposed yet: the experience trained nothing and may train again
            await asyncio.to_thread(store.release_consumption, cid)
            await _finish(store, row, status="error", decision="error", reason=reason, result=result)
        else:
            result.outcome, result.reason = "error", reason
        if stopped:
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(staged_dir, ignore_errors=True)


async def _propose(reef: Reef, plan: ScenarioPlan, batch: Batch, current: Any, row: CandidateRow,
                   scratch: Path, staged_dir: Path, progress: Any, result: StepResult,
                   lease: Holding | None = None) -> Candidate | None:
    """Run the recipe and stage its artifact; None when there is nothing to evaluate (the
    candidate row then says why)."""
    store, recipe_name, recipe = reef.store, plan.recipe_name, plan.recipe
    model = eval_context(reef, batch.scenario, progress)
    ctx = RecipeContext(scenario=batch.scenario, recipe=recipe_name, runtime=reef.runtime, store=store,
                        scratch_dir=scratch, progress=progress, log=logging.getLogger(f"reef.recipe.{recipe_name}"),
                        current=current, settings=reef.settings, _model=model, lease=lease,
                        stopping=model.cancelled)  # a stop also cuts the model call in flight
    try:
        proposed = await run_stoppable(recipe.propose, batch, current, ctx, stop=ctx.stopping,
                                       grace_s=stop_grace_s(reef), name=f"reef-propose-{row.id}")
        if proposed is not None and not isinstance(proposed, Candidate):
            raise TypeError(f"propose returned {type(proposed).__name__}, not a Candidate or None")
        if proposed is not None:
            staged, chash = await asyncio.to_thread(stage_candidate, proposed.artifact_dir, staged_dir)
    except Exception as exc:  # a recipe failure is reported, the server goes on
        # The experience returns under the return rule and the attempt counts: released as if
        # never taken, an item the recipe fails on came back at every step, and held the
        # scenario's learning for good (an item is spent after ``loop.max_attempts``).
        reason = f"recipe {recipe_name!r} failed: {type(exc).__name__}: {exc}"
        log.warning("%s: %s", batch.scenario, reason, exc_info=not isinstance(exc, ReefError))
        await _finish(store, row, status="error", decision="error", reason=reason, result=result,
                      return_experience=reef.settings.loop.max_attempts)
        return None
    if proposed is None:
        why = f": {ctx.skip_reason}" if ctx.skip_reason else ""
        await _finish(store, row, status="skipped", reason=f"the recipe proposed no update from this batch{why} "
                      "(the batch stays consumed)", result=result, outcome="skipped")
        if reef.observed("candidate_skipped"):
            reef.emit("candidate_skipped", scenario=batch.scenario, recipe=recipe_name, reason=result.reason,
                      kind=ctx.skip_kind if ctx.skip_kind in SKIP_KINDS else "other",
                      counts=dict(ctx.skip_counts or {}))
        return None
    proposed.id, proposed.scenario, proposed.recipe = row.id, batch.scenario, recipe_name
    proposed.base_release_id = row.base_release_id
    proposed.record_ids, proposed.report_ids = batch.record_ids, batch.report_ids
    proposed.artifact_dir = staged
    row.summary = proposed.summary
    row.artifact = {"content_hash": chash, "metadata": proposed.metadata,
                    "records": len(batch.record_ids), "reports": len(batch.report_ids)}
    row.status = "evaluating"
    await asyncio.to_thread(store.update_candidate, row.id, summary=row.summary, artifact=row.artifact,
                            status=row.status)
    fault_point("evaluating")
    return proposed


async def _evaluate(reef: Reef, plan: ScenarioPlan, candidate: Candidate, head: Any, current: Any,
                    row: CandidateRow, progress: Any, result: StepResult,
                    lease: Holding | None = None) -> tuple[Evaluation, Decision]:
    """The gate's verdict, recorded on the candidate and told to observers."""
    chash = row.artifact["content_hash"]
    decided = await asyncio.to_thread(reef.store.decided_candidate, candidate.scenario, chash, row.base_release_id)
    if head is not None and chash == head.content_hash:
        evaluation = Evaluation(evaluator="none")
        decision = Decision("reject", "the candidate is identical to the serving release")
    elif decided is not None:
        # the gate already decided this very artifact against this serving release (a retried
        # batch that reproduced it): the same verdict, without spending episodes on it again
        evaluation = Evaluation(evaluator="none", metrics={ALREADY_DECIDED: decided.id})
        decision = Decision(decided.decision, f"the gate already decided this artifact (content hash {chash[:12]}) "
                            f"against the same serving release: candidate {decided.id} was {decided.decision}; "
                            "not evaluated again")
    else:
        ectx = eval_context(reef, candidate.scenario, progress)
        evaluation, decision = await run_stoppable(run_gate, plan.evaluator, plan.evaluator_name, candidate,
                                                   current, ectx, plan.eval_timeout_s, stop=ectx.cancelled,
                                                   grace_s=stop_grace_s(reef), name=f"reef-gate-{row.id}")
    result.evaluation = {**evaluation.to_dict(), "decision": decision.outcome, "reason": decision.reason}
    status = STATUS[decision.outcome]
    # one transaction: the verdict, every episode, and (not selected) the experience's return —
    # unless the recipe's lineage already trained on it (then the batch is spent, not retried)
    returned = None if decision.outcome == "select" else returned_unless_trained(reef, plan)
    await asyncio.to_thread(reef.store.update_candidate, row.id, evaluation=evaluation.to_dict(),
                            decision=decision.outcome, reason=decision.reason, status=status,
                            episodes=list(evaluation.episodes or ()), return_experience=returned)
    row.status = status
    if decision.outcome != "select" and plan.recipe.keeps_lineage:
        await _guard_lineage(reef, candidate, evaluation, head, row, lease)
    if reef.observed("candidate_evaluated"):  # copies: an observer cannot change what gets published
        reef.emit("candidate_evaluated", candidate=copy.deepcopy(candidate), evaluation=copy.deepcopy(evaluation),
                     decision=decision)
    if decision.outcome != "select":
        result.outcome, result.reason = STATUS[decision.outcome], decision.reason
    return evaluation, decision


async def _publish(reef: Reef, plan: ScenarioPlan, candidate: Candidate, head: Any, evaluation: Evaluation,
                   decision: Decision, result: StepResult, lease: Holding | None) -> None:
    returned = returned_unless_trained(reef, plan)

    def publish() -> Any:
        def cas() -> Any:
            fault_point("fenced")
            return reef.releases.chain.publish(candidate.scenario, candidate.artifact_dir,
                                               expected_head=head.release_id if head else None, operation="train",
                                               candidate_id=candidate.id, evaluation=summarize(evaluation, decision))
        if lease is None:
            return cas()
        with reef.store.fenced(lease.scenario, lease.holder, lease.token):  # the lease cannot change hands here
            return cas()

    try:
        stored = await asyncio.to_thread(publish)
    except LeaseLost as exc:
        # never published: the experience trained nothing that serves; the process that holds
        # the lease now may have settled this candidate already (returning is idempotent)
        log.warning("%s: candidate %s fenced: %s", candidate.scenario, candidate.id, exc)
        await asyncio.to_thread(reef.store.update_candidate, candidate.id, status="fenced", reason=str(exc),
                                return_experience=returned)
        result.outcome, result.reason = "fenced", str(exc)
        return
    except PublishConflict as exc:
        # never published: the experience returns under the return rule (an attempt) and is
        # back in the pool at once, as the head moved; the chain is caught up so that the next
        # step builds on the new head
        await asyncio.to_thread(reef.store.update_candidate, candidate.id, status="conflict", reason=str(exc),
                                return_experience=returned)
        result.outcome, result.reason = "conflict", str(exc)
        try:
            await asyncio.to_thread(reef.releases.chain.catch_up, candidate.scenario)
            await reef.releases.serve_head(candidate.scenario)
        except Exception:  # the next step catches up before it settles or builds anything
            log.exception("%s: catching up the release chain after a conflict failed", candidate.scenario)
        return
    except Exception as exc:  # the candidate says why; whether the head moved anyway, the chain says
        reason = f"publishing failed: {type(exc).__name__}: {exc}"
        log.error("%s: %s", candidate.scenario, reason, exc_info=not isinstance(exc, ReefError))  # ours: one line
        result.outcome, result.reason = "error", reason
        if await _settle_failed_publish(reef, candidate.id, candidate.scenario, reason, returned):
            result.reason += "; the release reached the chain all the same and is recorded"
        return
    result.release_id = stored.release_id
    try:
        await reef.releases.activate(stored)
    except Exception as exc:  # published; the follower retries serving it
        reason = f"published, but serving it failed ({type(exc).__name__}: {exc}); the follower retries"
        log.exception("%s: release %s %s", candidate.scenario, stored.release_id, reason)
        result.outcome, result.reason = "error", reason
        return
    result.outcome, result.reason = "published", decision.reason
    if plan.recipe.keeps_lineage:  # the lineage continues from the snapshot that now serves
        await asyncio.to_thread(note_published, reef.state_dir, candidate, stored.release_id)


async def _guard_lineage(reef: Reef, candidate: Candidate, evaluation: Evaluation, head: Any,
                         row: CandidateRow, lease: Holding | None = None) -> None:
    """The divergence guard (``reef_core.commit.lineage.guard_divergence``): a snapshot the gate
    found significantly worse than serving resets its lineage to serving; the reason goes into
    the candidate's metadata (``lineage.reset``), which the metrics observer counts."""
    try:
        fence = (lambda: reef.store.fenced(lease.scenario, lease.holder, lease.token)) if lease else None
        reason = await asyncio.to_thread(guard_divergence, reef.state_dir, candidate, evaluation,
                                         head.release_id if head else None, fence=fence,
                                         token=lease.token if lease else None)
        if reason is not None:
            log.warning("%s: lineage reset: %s", candidate.scenario, reason)
            await asyncio.to_thread(reef.store.update_candidate, row.id, artifact=row.artifact)
    except Exception:  # the verdict stands; the next step judges the lineage again
        log.exception("%s: the lineage's divergence guard failed", candidate.scenario)


def whole_batches(eligible_n: int, size: int, most: int) -> int:
    """How many of ``eligible_n`` eligible experiences a step takes: as many whole batches of
    ``size`` as there are, up to ``most``; fewer than one batch (a manual step) takes them all."""
    if eligible_n < size:
        return eligible_n
    return min(eligible_n - eligible_n % size, most)


def stop_grace_s(reef: Reef) -> float:
    """How long a stopping server waits for a recipe's step or an evaluation to notice the stop
    and end (``server.shutdown_timeout_s``, the bound of its whole drain)."""
    return float(reef.settings.server.shutdown_timeout_s)


def returned_unless_trained(reef: Reef, plan: ScenarioPlan) -> int | None:
    """The return rule for the experience of a candidate that is not published (rejected,
    undecided, errored, fenced, in conflict): back to the pool under ``loop.max_attempts``,
    unless the recipe keeps a lineage, whose step trained on it for good (None: it stays
    consumed, so no report trains the lineage twice)."""
    return None if plan.recipe.keeps_lineage else reef.settings.loop.max_attempts


async def _settle_failed_publish(reef: Reef, cid: str, scenario: str, reason: str, returned: int | None) -> bool:
    """Settle a selected candidate whose publish raised. The store may have moved its head all
    the same (a push whose answer was lost), so the chain decides, caught up first: published
    when its release is there (``record`` marked it), else an error whose experience returns
    under the return rule. When the chain cannot be read, the candidate stays ``selected`` for
    the next lease holder to settle in the same way: its experience is never held for good.
    True when it was published."""
    try:
        await asyncio.to_thread(reef.releases.chain.catch_up, scenario)
    except Exception:
        log.exception("%s: candidate %s is left for the next growth step to settle", scenario, cid)
        await asyncio.to_thread(reef.store.update_candidate, cid, reason=reason)
        return False
    row = await asyncio.to_thread(reef.store.get_candidate, cid)
    if row is not None and row.status == "published":
        return True
    await asyncio.to_thread(reef.store.update_candidate, cid, status="error", reason=reason,
                            return_experience=returned)
    return False


async def _finish(store: Any, row: CandidateRow, *, status: str, reason: str, result: StepResult,
                  decision: str | None = None, outcome: str = "error", return_experience: int | None = None) -> None:
    """Record how a candidate ends before a verdict (it was stored as ``proposed``), its experience
    returned under the return rule with ``return_experience`` (``loop.max_attempts``)."""
    row.status, row.reason, row.decision = status, reason, decision
    decided = {"decision": decision} if decision else {}  # a decision stamps decided_at
    await asyncio.to_thread(store.update_candidate, row.id, status=status, reason=reason,
                            return_experience=return_experience, **decided)
    result.outcome, result.reason = outcome, reason
