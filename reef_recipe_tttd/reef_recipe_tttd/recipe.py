"""``TTTDRecipe``: TTT-Discover's training side as a Reef recipe.

The batch is one complete G×R grid of scored rollouts of one search step (``tttd_grid``
filter, ``batch_size`` = G×R); the barrier is checked again here. Constant-reward groups are
removed (when every group is constant the first is kept, as the reference does: the step then
trains the KL term alone, which pulls a policy that has collapsed onto one answer back towards
the base; with the policy still at the base, or ``kl_coef`` 0, it trains nothing), each
remaining group gets adaptive-β entropic leave-one-out advantages (``tttd``) or a group-mean baseline (``tttd-mean``), the centred
frozen-base KL is folded into the per-token advantages, and one Adam step on the un-clipped
importance-sampling token-sum loss trains the policy's LoRA (``TTTDAlgorithm``, run by
``reef_train``'s learner on the trainer backend the ``trainer`` option names: in process, or one
Ray task). Each grid is one candidate (``adapter/`` + ``learner/``), selected by ``always``:
test-time training has no held-out gate, the output that matters is the search archive's best
solution.

``search-only`` is the frozen-weights floor: the same grids are consumed and their metrics
logged, but nothing trains and no release is made.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef_core import (
    ActiveRelease,
    Batch,
    Candidate,
    Recipe,
    RecipeContext,
    refuse_bad_options,
    require_trainable,
    trainable_base,
)
from reef_train import (
    LoraOptions,
    learner_option_problems,
    lineage,
    read_learner_state,
    recorded_tokens_problem,
    vocab_size_of,
)
from reef_train.backend import make_trainer

from .grid import GridError, barrier, informative_groups

if TYPE_CHECKING:
    from .algorithm import Rollout

# The training code (``.algorithm``, reef_train's learner: torch) is imported where it runs, not
# here: checking a configuration's options reads this class's signature (``reef config``, every
# command that composes a served configuration), which must not cost torch's import.

VARIANTS = ("tttd", "tttd-mean", "search-only")


class TTTDRecipe(Recipe):
    """Trains the policy's LoRA once per complete grid of a TTT-Discover search step."""

    update_target = "adapter"
    default_evaluator = "always"
    keeps_lineage = True

    def __init__(self, variant: str = "tttd", groups_per_step: int = 8, rollouts_per_group: int = 64,
                 max_staleness: int = lineage.MAX_STALENESS, lr: float = 4e-5, beta1: float = 0.9, beta2: float = 0.95,
                 eps: float = 1e-8, weight_decay: float = 0.0, kl_coef: float = 0.1, lora_rank: int = 32,
                 lora_alpha: int = 32, lora_lm_head: bool = False, device: str = "auto", seed: int = 0,
                 micro_batch_tokens: int = 512, trainer: dict[str, Any] | None = None,
                 state_dir: str | Path | None = None):
        refuse_bad_options(type(self), locals())
        #: the policy's LoRA and its Adam (L2 weight decay, no gradient clipping: the reference's)
        self.lora = LoraOptions.from_options(locals(), max_grad_norm=None, optimizer="adam")
        #: where the training step runs (``reef_train.make_trainer``: local or ray)
        self.trainer = make_trainer(trainer)
        self.variant = variant
        self.groups = int(groups_per_step)
        self.rollouts = int(rollouts_per_group)
        self.batch_size = self.groups * self.rollouts
        self.max_staleness = int(max_staleness)
        from .algorithm import TTTDAlgorithm

        #: TTT-Discover's advantages and loss, run by reef_train's learner
        self.algorithm = TTTDAlgorithm(variant=variant, kl_coef=float(kl_coef),
                                       micro_batch_tokens=int(micro_batch_tokens))
        #: the learner lineage of each scenario (docs/learning.md): each grid step trains on its
        #: head and advances it, whether or not the gate publishes the candidate
        self.lineages = lineage.lineages_in(state_dir)

    @classmethod
    def option_problems(cls, o: dict[str, Any]) -> list[str]:
        """Every problem of the option values, without building anything (``reef config`` asks)."""
        problems = []
        if o["variant"] not in VARIANTS:
            problems.append(f"variant must be one of {', '.join(VARIANTS)}, not {o['variant']!r}")
        if o["groups_per_step"] < 1 or o["rollouts_per_group"] < 2:
            problems.append("groups_per_step must be 1 or more and rollouts_per_group 2 or more")
        if o["max_staleness"] < 0:
            problems.append("max_staleness must be 0 or more")
        if o["kl_coef"] < 0 or not math.isfinite(o["kl_coef"]):
            problems.append("kl_coef must be 0 or more")
        if o["micro_batch_tokens"] < 1:
            problems.append("micro_batch_tokens must be 1 or more")
        problems += learner_option_problems(o, max_grad_norm=None, optimizer="adam")
        return problems

    @property
    def trains(self) -> bool:
        return self.variant != "search-only"

    @property
    def filters(self) -> list[Any]:
        # staleness is counted in lineage steps (``propose`` skips a stale grid)
        return ["scored", ("tttd_grid", {"groups_per_step": self.groups, "rollouts_per_group": self.rollouts})]

    def propose(self, batch: Batch, current: ActiveRelease | None, ctx: RecipeContext) -> Candidate | None:
        from reef_train import Sample, StepPayload, run_steps

        from .algorithm import reward_stats

        try:
            grid = barrier(list(batch), self.groups, self.rollouts)
        except GridError as exc:
            return self._not_a_grid(ctx, str(exc))
        rewards = grid.group_rewards()
        keep, removed = informative_groups(rewards)
        flat = [r for rs in rewards for r in rs]
        metrics: dict[str, Any] = {
            "variant": self.variant, "grid_step": grid.step, "run": grid.run,
            "groups_per_step": self.groups, "rollouts_per_group": self.rollouts, "grid_size": len(flat),
            **reward_stats(flat),
            "constant_groups": sum(1 for rs in rewards if max(rs) == min(rs)), "constant_groups_removed": removed,
            "training_groups": len(keep), "training_size": len(keep) * self.rollouts,
        }
        bests = [e.metadata.get("archive_best") for e in grid.ordered()]
        bests = [float(b) for b in bests if isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b)]
        if bests:
            metrics["archive_best_reward"] = max(bests)
        if not self.trains:
            ctx.skip("search-only: nothing trains", "not_training")
            ctx.log.info("tttd step %d (search-only, nothing trains): %s", grid.step, _fmt(metrics))
            return None
        # every group constant: no reward signal, every advantage 0; only the KL term can move the
        # policy (towards the base), and does when there is a KL term and an adapter to move
        kl_only = metrics["constant_groups"] == len(rewards)
        if kl_only and self.algorithm.kl_coef == 0:
            return self._nothing_to_learn(ctx, grid.step, "and kl_coef is 0")
        served = trainable_base(ctx.runtime)
        vocab_size = vocab_size_of(served.base_model().path) if served is not None else None
        groups = []
        for g in keep:
            group = []
            for r in range(self.rollouts):
                exp = grid.cells[(g, r)]
                rollout = _rollout(exp, vocab_size)
                if isinstance(rollout, str):
                    where = f"report {exp.report_id} (step {grid.step}, group {g}, rollout {r}): {rollout}"
                    if rollout.startswith(NO_TOKENS):  # the runtime's configuration: an error says what to change
                        raise GridError(where)
                    return self._not_a_grid(ctx, where)  # this batch's data: skipped, or it came back every step
                group.append(rollout)
            groups.append(group)
        head = lineage.continued_head(self.lineages, batch.scenario, current, ctx.log, ctx)
        head, reset = lineage.keep_up(self.lineages, batch.scenario, head, current, self.max_staleness, ctx.log, ctx)
        # a grid trains whole or not at all: one rollout sampled too far behind the head spoils it
        lags = [lineage.lag_of(head, rec.release_id) for exp in grid.ordered() for rec in exp.records]
        stale = sum(lag > self.max_staleness for lag in lags)
        if stale:
            ctx.skip(f"{stale} rollout(s) of grid step {grid.step} were sampled more than max_staleness "
                     f"{self.max_staleness} lineage steps behind the head (policy lag up to {max(lags)})", "stale",
                     rollouts_stale=len(lags))
            ctx.log.info("tttd: %s", ctx.skip_reason)
            return None
        metrics.update(lineage_lag_max=max(lags, default=0), lineage_lag_mean=sum(lags) / len(lags) if lags else 0.0)
        runtime = require_trainable(ctx.runtime, ctx.recipe)
        base = runtime.base_model()
        adapter, learner_dir, source = lineage.learner_source(head, current, runtime, "tttd")
        if kl_only and adapter is None:
            return self._nothing_to_learn(ctx, grid.step, "and the policy is the base model (no adapter yet)")
        metrics["kl_only"] = kl_only
        before = read_learner_state(learner_dir, "tttd") if learner_dir is not None else None
        artifact = ctx.new_artifact()
        with ctx.progress.task(f"tttd step {grid.step}: {len(keep)} group(s) x {self.rollouts} "
                               f"({self.trainer.options.backend})", total=1) as bar:
            # a TrainerError (the step failed or was lost on Ray) propagates: the candidate fails
            # with its sentence, nothing is published
            bound = lineage.kl_bound(ctx)  # the divergence guard measures the KL to serving on this grid
            rows = [r for group in groups for r in group]
            payload = StepPayload(self.algorithm, self.lora, [groups],
                                  kl_samples=[Sample(r.prompt_ids, r.response_ids, r.logprobs) for r in rows]
                                  if bound is not None else None, kl_temperatures=[r.temperature for r in rows])
            result = run_steps(self.trainer, payload, base=base, adapter=adapter, state=learner_dir, output=artifact,
                               reference=runtime.adapter_of(current), stop=ctx.stopping)
            bar.advance()
        metrics.update(result["steps"][0])
        if result.get("kl") is not None:
            metrics["lineage_kl"] = result["kl"]
        trained = result["counters"]["steps"] - (before.counters["steps"] if before is not None else 0)
        new = lineage.advance(self.lineages, batch.scenario, artifact, head=head, current=current, steps=trained,
                              meta={"recipe": ctx.recipe, "from": source, "grid_step": grid.step,
                                    "reward_mean": metrics.get("reward_mean"),
                                    "lineage_lag_max": metrics["lineage_lag_max"],
                                    "lineage_lag_mean": metrics["lineage_lag_mean"], "kl": result.get("kl")}, ctx=ctx)
        reset = lineage.guard_kl(self.lineages, batch.scenario, new, current, result.get("kl"), bound, ctx.log,
                                 ctx) or reset
        ctx.log.info("tttd step %d: %s", grid.step, _fmt(metrics))
        return Candidate(
            scenario=batch.scenario, recipe=ctx.recipe, artifact_dir=artifact,
            base_release_id=current.release_id if current else None,
            summary=(f"{self.variant} grid step {grid.step}: {len(keep)}x{self.rollouts} rollouts"
                     + (" (every group constant: the KL term alone trained)" if kl_only else "") + ", reward mean "
                     f"{metrics['reward_mean']:.3f} max {metrics['reward_max']:.3f}, beta {metrics['beta_mean']:.3g}"),
            metadata={"tttd": {"metrics": metrics, "learner_steps": result["counters"]["steps"],
                               "learner_from": source},
                      "lineage": lineage.candidate_metadata(new, reset=reset, lags=lags)},
        )

    @staticmethod
    def _not_a_grid(ctx: RecipeContext, why: str) -> None:
        """Skip a batch that cannot train (a broken grid, a rollout without usable tokens): raised,
        the step would hand the same batch back at the next step, for good."""
        ctx.skip(f"the batch is not a training grid: {why}", "no_usable_rollout")
        ctx.log.warning("tttd: the batch is rejected and does not train: %s", why)
        return None

    @staticmethod
    def _nothing_to_learn(ctx: RecipeContext, step: int, why: str) -> None:
        ctx.skip(f"nothing to learn: every group of grid step {step} has a constant reward (no reward signal) {why}; "
                 "the lineage did not move", "nothing_to_learn")
        ctx.log.info("tttd: %s", ctx.skip_reason)
        return None


NO_TOKENS = "its record carries no token ids and sampling logprobs"


def _rollout(exp: Any, vocab_size: int | None = None) -> Rollout | str:
    if len(exp.records) != 1:
        return f"quotes {len(exp.records)} records; a rollout is exactly one"
    rec = exp.records[0]
    prompt, response, logprobs = rec.prompt_token_ids, rec.response_token_ids, rec.logprobs
    problem = recorded_tokens_problem(prompt, response, logprobs, vocab_size)
    if problem == "no_tokens":
        return NO_TOKENS + "; serve a trainable runtime (runtime=local) or use variant=search-only"
    if problem:
        return (f"its record's token ids or sampling logprobs are malformed or outside the base model's vocabulary"
                f"{f' of {vocab_size}' if vocab_size else ''} (not ids of this model, e.g. recorded from another one, or "
                "logprobs not finite and <= 0)")
    from .algorithm import Rollout

    return Rollout(prompt_ids=list(prompt), response_ids=list(response), logprobs=[float(x) for x in logprobs],
                   reward=float(exp.score), temperature=_temperature(rec))


def _temperature(rec: Any) -> float:
    t = getattr(rec, "logprobs_temperature", None)
    if t is None:
        t = (rec.request or {}).get("temperature")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 else 1.0


def _fmt(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
