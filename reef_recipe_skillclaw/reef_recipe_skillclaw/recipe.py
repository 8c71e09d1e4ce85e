"""The ``skillclaw`` recipe: the day's reports and sessions become one composite edit of the skill pool.

A growth step is a night (``night.Night``) over a batch of reports, a day's tasks: passes and
failures alike, and reports carrying the unscored sentinel (−1), which the night's judge scores.
The pool of the serving release is the starting point; the changed skills (created or updated,
never removed) are written into one candidate artifact with the per-skill rationale in its
metadata. The scenario's evaluator decides (``task_suite`` by default; ``evaluator=always``
publishes every night that changed something, for "the next day is the measurement").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reef_core import ActiveRelease, Batch, Candidate, Recipe, refuse_bad_options

from . import RECIPE
from .digest import build_digest
from .evolver import RetryingEvolver, build_evolver, check_evolver
from .night import DEFAULT_WEIGHTS, DIMENSIONS, Night, load_prompts
from .pool import SkillPool


class SkillClawRecipe(Recipe):
    """Grows and edits the harness skill pool from a day of agent work, with an evolver model."""

    update_target = "harness"
    # the other turns of each report's x-reef-session come along as context
    filters = ("session",)
    default_evaluator = "task_suite"

    def __init__(self, batch_size: int = 20, evolver: Any = "runtime", retries: int = 6, backoff_s: float = 1.0,
                 backoff_cap_s: float = 30.0, timeout_s: float = 120.0, unscored: float = -1.0,
                 judge_weights: dict[str, float] | None = None, max_sessions_per_group: int = 30,
                 digest_chars: int = 4000, summary_max_tokens: int = 600, judge_max_tokens: int = 1200,
                 decide_max_tokens: int = 1500, merge_max_tokens: int = 1500,
                 catalogue_counts_as_use: bool = False, prompts_dir: str | None = None):
        refuse_bad_options(type(self), locals())
        weights = {**DEFAULT_WEIGHTS, **(judge_weights or {})}
        self.batch_size = int(batch_size)
        self.evolver = evolver
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.backoff_cap_s = float(backoff_cap_s)
        self.timeout_s = float(timeout_s)
        self.unscored = float(unscored)
        self.weights = {k: float(v) for k, v in weights.items()}
        self.max_sessions_per_group = int(max_sessions_per_group)
        self.digest_chars = int(digest_chars)
        self.max_tokens = {"summary": summary_max_tokens, "judge": judge_max_tokens, "decide": decide_max_tokens,
                           "merge": merge_max_tokens}
        self.catalogue_counts_as_use = bool(catalogue_counts_as_use)
        self.prompts = load_prompts(prompts_dir)

    @classmethod
    def option_problems(cls, o: dict[str, Any]) -> list[str]:
        """Every problem of the option values, without building anything (``reef config`` asks)."""
        problems = []
        if o["batch_size"] < 0:
            problems.append("batch_size must be 0 (nights on schedule or `reef grow` only) or more")
        try:
            check_evolver(o["evolver"])
        except ValueError as exc:
            problems.append(str(exc))
        if o["retries"] < 1 or o["backoff_s"] < 0 or o["backoff_cap_s"] < o["backoff_s"] or o["timeout_s"] <= 0:
            problems.append("retries must be 1 or more, 0 <= backoff_s <= backoff_cap_s, timeout_s positive")
        weights = {**DEFAULT_WEIGHTS, **(o["judge_weights"] or {})}
        if set(weights) != set(DIMENSIONS) or any(float(w) < 0 for w in weights.values()) or not sum(weights.values()):
            problems.append(f"judge_weights takes non-negative weights of {', '.join(DIMENSIONS)}, not all zero")
        if o["max_sessions_per_group"] < 1 or o["digest_chars"] < 200:
            problems.append("max_sessions_per_group must be 1 or more and digest_chars 200 or more")
        if o["prompts_dir"] is not None and not Path(o["prompts_dir"]).is_dir():
            problems.append(f"prompts_dir {o['prompts_dir']!r} is not a directory")
        return problems

    def night(self, ctx: Any, sleep: Any = None) -> tuple[Night, RetryingEvolver]:
        """The night's steps over this recipe's evolver (retried) and prompts."""
        evolver = RetryingEvolver(build_evolver(self.evolver, ctx, timeout_s=self.timeout_s), attempts=self.retries,
                                  base_s=self.backoff_s, cap_s=self.backoff_cap_s,
                                  **({"sleep": sleep} if sleep is not None else {}))
        night = Night(evolver, self.prompts, weights=self.weights, max_sessions=self.max_sessions_per_group,
                      digest_chars=self.digest_chars, summary_max_tokens=self.max_tokens["summary"],
                      judge_max_tokens=self.max_tokens["judge"], decide_max_tokens=self.max_tokens["decide"],
                      merge_max_tokens=self.max_tokens["merge"])
        return night, evolver

    def propose(self, batch: Batch, current: ActiveRelease | None, ctx: Any) -> Candidate | None:
        base = SkillPool.load(current.harness_dir if current is not None else None)
        digests = [build_digest(e, base.names, unscored=self.unscored,
                                catalogue_counts_as_use=self.catalogue_counts_as_use) for e in batch]
        if not digests:
            return None
        night, evolver = self.night(ctx)
        try:
            result = night.run(digests, base)
        finally:
            close = getattr(evolver.inner, "close", None)
            if close is not None:
                close()
        changes = result.pool.diff(base)
        decisions = [d.to_dict() for d in result.decisions]
        scored = [d.effective_score for d in digests if d.effective_score is not None]
        day = {"tasks": len(digests), "reported": sum(d.reliable for d in digests),
               "judged": len(result.judged), "mean_score": round(sum(scored) / len(scored), 4) if scored else None}
        ctx.log.info("skillclaw: a night over %d task(s): %s", len(digests),
                     "; ".join(f"{d['group']}: {d['action']}" + (f" ({d['note']})" if d["note"] else "")
                               for d in decisions) or "no groups")
        if not changes:
            return None
        artifact = ctx.new_artifact()
        result.pool.write(artifact / "harness", [c.name for c in changes])
        for change in changes:
            result.rationale.setdefault(change.name, {"action": change.op, "steps": []})
            result.rationale[change.name]["change"] = change.op
            result.rationale[change.name]["fields"] = list(change.fields)
        metadata = {
            "changes": [{"op": c.op, "name": c.name, "fields": list(c.fields)} for c in changes],
            "rationale": result.rationale,
            "decisions": decisions,
            "day": day,
            "judged": result.judged,
            "summaries": result.summaries,
            "pool_before": base.names,
            "pool_after": result.pool.names,
            "evolver": {"calls": evolver.calls, "failed": evolver.failures},
        }
        summary = "; ".join(f"{c.op} {c.name} ({result.rationale[c.name].get('action')})" for c in changes)
        return Candidate(scenario=batch.scenario, recipe=getattr(ctx, "recipe", RECIPE), artifact_dir=artifact,
                         base_release_id=current.release_id if current is not None else None,
                         summary=f"SkillClaw night over {len(digests)} task(s): {summary}",
                         metadata={"skillclaw": metadata})
