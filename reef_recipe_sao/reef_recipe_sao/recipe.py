"""``SAORecipe``: Single-rollout Asynchronous Optimization as a Reef recipe.

Each eligible report with a finite score and exactly one reference is one rollout: the
record's prompt and response token ids and its sampling logprobs (with their temperature)
are what the step trains on. ``batch_size`` of them make one optimizer step. Every step trains
the scenario's learner lineage (``reef_core.commit.lineage``) and advances it, published or
not; a step that moves the policy proposes a snapshot of the new head (``adapter/`` plus
``learner/``) as a candidate, gated by ``task_suite`` on held-out tasks. The training itself is ``reef_train``'s learner running
``SAOAlgorithm`` (``algorithm.py``: SAO's advantages and loss), on the trainer backend the
``trainer`` option names (in process, or one Ray task). See docs/recipes/sao.md for the
algorithm and every option.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from reef_core import (
    ActiveRelease,
    Batch,
    Candidate,
    Experience,
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

if TYPE_CHECKING:
    from reef_core import LineageHead

    from .algorithm import Rollout

# The training code (``.algorithm``, reef_train's learner: torch) is imported where it runs, not
# here: checking a configuration's options reads this class's signature (``reef config``, every
# command that composes a served configuration), which must not cost torch's import.

Mode = Literal["sao", "grpo_dis"]


class SAORecipe(Recipe):
    """Trains the policy's LoRA with DIS on scored single rollouts, with a LoRA critic (``sao``)
    or group-normalised advantages (``grpo_dis``, the control arm)."""

    update_target = "adapter"
    default_evaluator = "task_suite"
    keeps_lineage = True

    def __init__(
        self,
        mode: Mode = "sao",
        batch_size: int = 8,
        steps_per_candidate: int = 1,
        max_batches: int = 1,
        max_staleness: int = lineage.MAX_STALENESS,
        lr: float = 2e-4,
        critic_lr: float = 1e-3,
        critic_steps_per_actor: int = 2,
        num_critic_only_steps: int = 10,
        eps_clip_low: float = 0.3,
        eps_clip_high: float = 5.0,
        lambda_alpha: float = 1.5,
        gamma: float = 1.0,
        n_samples_per_prompt: int = 1,
        lora_rank: int = 16,
        lora_alpha: int = 32,
        lora_lm_head: bool = False,
        max_grad_norm: float = 1.0,
        device: str = "auto",
        seed: int = 0,
        trainer: dict[str, Any] | None = None,
        state_dir: str | Path | None = None,
    ):
        refuse_bad_options(type(self), locals())
        #: the policy's (and the critic's) LoRA and optimizer
        self.lora = LoraOptions.from_options(locals())
        #: where the training step runs (``reef_train.make_trainer``: local or ray)
        self.trainer = make_trainer(trainer)
        self.mode = mode
        #: rollouts per optimizer step (the option ``batch_size``)
        self.step_size = int(batch_size)
        self.steps_per_candidate = int(steps_per_candidate)
        #: what the kernel hands ``propose``: every step of one candidate
        self.batch_size = self.step_size * self.steps_per_candidate
        #: whole batches one growth step may take when more are waiting (``Recipe.max_batches``):
        #: one optimizer step per ``step_size`` rollouts of them all, one candidate
        self.max_batches = int(max_batches)
        self.max_staleness = int(max_staleness)
        self.n_samples_per_prompt = int(n_samples_per_prompt)
        from .algorithm import SAOAlgorithm

        #: SAO's advantages and loss, run by reef_train's learner
        self.algorithm = SAOAlgorithm(
            mode=mode, critic_lr=float(critic_lr) if mode == "sao" else None,
            critic_steps_per_actor=int(critic_steps_per_actor), num_critic_only_steps=int(num_critic_only_steps),
            eps_clip_low=float(eps_clip_low), eps_clip_high=float(eps_clip_high), lambda_alpha=float(lambda_alpha),
            gamma=float(gamma))
        #: the learner lineage of each scenario (``reef_core.commit.lineage``): every step trains
        #: on its head and advances it, published or not (warm-up steps too)
        self.lineages = lineage.lineages_in(state_dir)

    @classmethod
    def option_problems(cls, o: dict[str, Any]) -> list[str]:
        """Every problem of the option values, without building anything (``reef config`` asks)."""
        problems = []
        if o["mode"] not in ("sao", "grpo_dis"):
            problems.append(f"mode must be 'sao' or 'grpo_dis', not {o['mode']!r}")
        if o["batch_size"] < 1 or o["steps_per_candidate"] < 1 or o["max_batches"] < 1:
            problems.append("batch_size, steps_per_candidate and max_batches must be 1 or more")
        if o["max_staleness"] < 0:
            problems.append("max_staleness must be 0 or more")
        if not o["critic_lr"] > 0:
            problems.append("critic_lr must be above 0")
        if o["critic_steps_per_actor"] < 0 or o["num_critic_only_steps"] < 0:
            problems.append("critic_steps_per_actor and num_critic_only_steps must be 0 or more")
        if not 0 < o["eps_clip_low"] <= 1 or o["eps_clip_high"] <= 0:
            problems.append("eps_clip_low must be in (0, 1] and eps_clip_high above 0")
        if o["lambda_alpha"] <= 0 or not 0 <= o["gamma"] <= 1:
            problems.append("lambda_alpha must be above 0 and gamma in [0, 1]")
        n = o["n_samples_per_prompt"]
        if n < 1:
            problems.append("n_samples_per_prompt must be 1 or more")
        if o["mode"] == "grpo_dis" and n < 2:
            problems.append("mode grpo_dis needs n_samples_per_prompt of 2 or more (rollouts of one prompt "
                            "are its baseline)")
        if o["mode"] == "grpo_dis" and o["batch_size"] % max(n, 1):
            problems.append("in mode grpo_dis batch_size must be a multiple of n_samples_per_prompt, so a batch "
                            "holds whole groups")
        problems += learner_option_problems(o)
        return problems

    @property
    def filters(self) -> list[Any]:
        return ["scored", "single_reference"]

    # ------------------------------------------------------------------ propose

    def propose(self, batch: Batch, current: ActiveRelease | None, ctx: RecipeContext) -> Candidate | None:
        from reef_train import Sample, StepPayload, run_steps

        head = lineage.continued_head(self.lineages, batch.scenario, current, ctx.log, ctx)
        head, reset = lineage.keep_up(self.lineages, batch.scenario, head, current, self.max_staleness, ctx.log, ctx)
        served = trainable_base(ctx.runtime)
        rollouts, dropped = self.rollouts(batch, head, vocab_size_of(served.base_model().path) if served else None)
        if not rollouts:
            only_stale = dropped["stale"] == sum(dropped.values())
            ctx.skip(f"no usable rollout in this batch ({_counts(dropped)})",
                     "stale" if only_stale else "no_usable_rollout", rollouts_stale=dropped["stale"])
            ctx.log.info("sao: %s", ctx.skip_reason)
            return None
        runtime = require_trainable(ctx.runtime, ctx.recipe)
        base = runtime.base_model()
        adapter, learner_dir, source = self.learner_source(head, current, runtime)
        before = read_learner_state(learner_dir, "sao") if learner_dir is not None else None
        chunks = self.steps_of(rollouts)
        artifact = ctx.new_artifact()
        with ctx.progress.task(f"sao ({self.mode}): {len(chunks)} step(s), {len(rollouts)} rollouts "
                               f"({self.trainer.options.backend})", total=1) as bar:
            # a TrainerError (the step failed or was lost on Ray) propagates: the candidate fails
            # with its sentence, nothing is published and the lineage does not move
            bound = lineage.kl_bound(ctx)  # the divergence guard measures the KL to serving on these rollouts
            payload = StepPayload(self.algorithm, self.lora, chunks,
                                  kl_samples=[Sample(r.prompt_ids, r.response_ids, r.logprobs) for r in rollouts]
                                  if bound is not None else None, kl_temperatures=[r.temperature for r in rollouts])
            result = run_steps(self.trainer, payload, base=base, adapter=adapter, state=learner_dir, output=artifact,
                               reference=runtime.adapter_of(current), stop=ctx.stopping)
            bar.advance()
        steps, state = result["steps"], result["counters"]
        metrics = step_metrics(steps)
        metrics.update({f"rollouts_dropped_{k}": v for k, v in dropped.items()})
        # off-policy: the traffic was sampled from serving, which the lineage may be steps ahead of
        lags = [r.lag for r in rollouts]
        metrics.update(lineage_lag_max=max(lags), lineage_lag_mean=sum(lags) / len(lags))
        metrics["rollouts_dropped"] = sum(dropped.values()) + metrics.get("rollouts_dropped_ungrouped", 0)
        if result.get("kl") is not None:
            metrics["lineage_kl"] = result["kl"]
        ctx.log.info("sao step %d: %s", metrics["step"], _counts({k: v for k, v in metrics.items()
                                                                  if isinstance(v, (int, float))}))
        # a gradient that is not finite did not step (reef_train.optimizer_step): it moved nothing
        moved = any(m.get("actor_updated") and 0 < m.get("actor_grad_norm", 0.0) < math.inf for m in steps)
        warmed = any(not m.get("actor_updated") and m.get("rollouts_used", 0) for m in steps)
        if not (moved or warmed):
            # nothing to learn from (e.g. no reward: the actor's gradient is zero): the lineage
            # stays where it is and there is nothing to gate
            ctx.skip("nothing to learn: the actor's gradient is 0 (e.g. no reward) and no warm-up step ran; the "
                     "lineage did not move", "nothing_to_learn", rollouts_stale=dropped["stale"])
            ctx.log.info("sao: %s", ctx.skip_reason)
            return None
        trained = state["steps"] - (before.counters["steps"] if before is not None else 0)
        new = lineage.advance(
            self.lineages, batch.scenario, artifact, head=head, current=current, steps=trained,
            meta={"recipe": ctx.recipe, "mode": self.mode, "counters": dict(state), "from": source,
                  "reward_mean": metrics.get("reward_mean"), "lineage_lag_max": metrics["lineage_lag_max"],
                  "lineage_lag_mean": metrics["lineage_lag_mean"], "kl": result.get("kl")}, ctx=ctx)
        reset = lineage.guard_kl(self.lineages, batch.scenario, new, current, result.get("kl"), bound, ctx.log,
                                 ctx) or reset
        if not moved:
            # critic only (warm-up): the policy is unchanged, so there is nothing to gate; the
            # lineage keeps the critic, so warm-up happens once per lineage
            ctx.skip(f"critic warm-up (lineage step {new.step}): the policy did not move", "warm_up",
                     rollouts_stale=dropped["stale"])
            return None
        return Candidate(
            scenario=batch.scenario, recipe=ctx.recipe, artifact_dir=artifact,
            base_release_id=current.release_id if current else None,
            summary=summary_of(self.mode, new.step, metrics, steps, dropped["stale"]),
            metadata={"sao": {"mode": self.mode, "metrics": metrics, "learner_from": source,
                              "steps": state["steps"], "actor_steps": state["actor_steps"],
                              "critic_steps": state["critic_steps"], "rollouts_used_total": state["rollouts_used"]},
                      "lineage": lineage.candidate_metadata(new, reset=reset, rollouts_stale=dropped["stale"],
                                                            lags=lags)},
        )

    def steps_of(self, rollouts: list[Rollout]) -> list[list[Rollout]]:
        """The optimizer steps of one candidate: ``batch_size`` rollouts each, in order (the last
        may be short; in ``grpo_dis`` a prompt's group stays in one step)."""
        if len(rollouts) <= self.step_size:
            return [rollouts]
        if self.mode == "grpo_dis":
            groups: dict[tuple[int, ...], list[Rollout]] = {}
            for r in rollouts:
                groups.setdefault(tuple(r.prompt_ids), []).append(r)
            steps: list[list[Rollout]] = [[]]
            for group in groups.values():
                if steps[-1] and len(steps[-1]) + len(group) > self.step_size:
                    steps.append([])
                steps[-1].extend(group)
            return steps
        return [rollouts[i:i + self.step_size] for i in range(0, len(rollouts), self.step_size)]

    def rollouts(self, batch: Batch, head: LineageHead | None,
                 vocab_size: int | None = None) -> tuple[list[Rollout], dict[str, int]]:
        """The batch's trainable rollouts and how many experiences were left out, by reason (a
        rollout sampled more than ``max_staleness`` lineage steps behind ``head`` is ``stale``; one
        whose tokens are malformed, or outside the base model's vocabulary of ``vocab_size`` when
        it is known, e.g. recorded from another model, is ``bad_tokens``)."""
        dropped = {"multi_reference": 0, "unscored": 0, "no_tokens": 0, "bad_tokens": 0, "stale": 0}
        out = []
        for exp in batch:
            reason, rollout = self.rollout(exp, head, vocab_size)
            if reason:
                dropped[reason] += 1
            else:
                out.append(rollout)
        return out, dropped

    def rollout(self, exp: Experience, head: LineageHead | None,
                vocab_size: int | None = None) -> tuple[str | None, Rollout | None]:
        if len(exp.records) != 1:
            return "multi_reference", None
        if exp.score is None or isinstance(exp.score, bool) or not math.isfinite(exp.score):
            return "unscored", None
        rec = exp.records[0]
        prompt, response, logprobs = rec.prompt_token_ids, rec.response_token_ids, rec.logprobs
        problem = recorded_tokens_problem(prompt, response, logprobs, vocab_size)
        if problem:
            return problem, None
        lag = lineage.lag_of(head, rec.release_id)
        if lag > self.max_staleness:
            return "stale", None
        from .algorithm import Rollout

        return None, Rollout(prompt_ids=list(prompt), response_ids=list(response), logprobs=[float(x) for x in logprobs],
                             temperature=record_temperature(rec), reward=float(exp.score), lag=lag,
                             release_id=rec.release_id)

    # ------------------------------------------------------------------ learner state

    def learner_source(self, head: LineageHead | None, current: ActiveRelease | None,
                       runtime: Any) -> tuple[Path | None, Path | None, str]:
        """(adapter, learner state, where they come from) for the next step: the lineage head's
        checkpoint, else the serving release's adapter and ``learner/``, else nothing (new)."""
        return lineage.learner_source(head, current, runtime, "sao")


def step_metrics(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """One candidate's metrics over all its optimizer steps: the last step's losses and norms,
    the counts summed, the reward averaged over every rollout trained on (not the last step's)."""
    metrics = dict(steps[-1])
    metrics["actor_updated"] = any(m.get("actor_updated") for m in steps)
    for key in {k for m in steps for k in m if k == "rollouts_used" or k.startswith("rollouts_dropped")}:
        metrics[key] = sum(m.get(key, 0) for m in steps)
    rewarded = [(m["reward_mean"], m.get("rollouts_used", 0)) for m in steps if "reward_mean" in m]
    if rewarded:
        n = sum(w for _, w in rewarded)
        metrics["reward_mean"] = sum(r * w for r, w in rewarded) / n if n else rewarded[-1][0]
    actor = [m["pg_clipfrac"] for m in steps if "pg_clipfrac" in m]
    if actor:
        metrics["pg_clipfrac"] = sum(actor) / len(actor)
    metrics["optimizer_steps"] = len(steps)
    if len(steps) > 1:
        metrics["steps_detail"] = steps
    return metrics


def summary_of(mode: str, step: int, metrics: dict[str, Any], steps: list[dict[str, Any]], stale: int) -> str:
    """The candidate's one line: every optimizer step's reward (not only the last one's), the
    rollouts dropped as stale and the policy lag of those trained on."""
    per_step = ", ".join(f"{m['reward_mean']:.3f}" + ("" if m.get("actor_updated") else " warm-up")
                         for m in steps if "reward_mean" in m)
    line = (f"{mode} lineage step {step}: {metrics['rollouts_used']} rollout(s) in {metrics['optimizer_steps']} "
            f"optimizer step(s), reward {metrics['reward_mean']:.3f}")
    if len(steps) > 1:
        line += f" (by step: {per_step})"
    line += f", clipfrac {metrics.get('pg_clipfrac', 0.0):.3f}, policy lag max {metrics['lineage_lag_max']}"
    return line + (f", {stale} stale rollout(s) dropped" if stale else "")


def record_temperature(rec: Any) -> float:
    """The temperature the record's logprobs were taken at: as the runtime recorded it, else the
    request's (greedy and unset count as 1, the recording convention)."""
    t = getattr(rec, "logprobs_temperature", None)
    if t is None:
        t = (rec.request or {}).get("temperature")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 else 1.0


def _counts(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()) or "-"
