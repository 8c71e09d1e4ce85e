"""``OpenClawRecipe``: learn from what happens next (OpenClaw-RL) on the served model's LoRA.

The experience is *computed*: the recipe's ``TurnProcessor`` (``processor.py``) turns served
traffic into judged turns and stores each one that trains as a report; explicit reports quoting
a record work too (their score is the reward, their feedback text a hint). ``propose`` trains
one batch of them and returns the new adapter (with the learner's state, ``learner/``); the
candidate's metadata and one line of ``prm_record_file`` per batch say, for every turn, the
judge's votes, the hints, the reward and the dispatch. The training itself is ``reef_train``'s
learner running ``OpenClawAlgorithm`` (``algorithm.py``: OpenClaw's loss), on the trainer
backend the ``trainer`` option names (in process, or one Ray task).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from reef_core import (
    ActiveRelease,
    Batch,
    Candidate,
    ConfigError,
    Experience,
    Recipe,
    RecipeContext,
    refuse_bad_options,
    require_trainable,
    trainable_base,
)
from reef_train import LoraOptions, learner_option_problems, lineage, read_learner_state, vocab_size_of
from reef_train.backend import make_trainer

from .dispatch import dispatch
from .judge import check_judge_spec, judge_spec
from .prm import MAX_HINT_CHARS, MIN_HINT_CHARS
from .processor import METADATA_KEY, ProcessorOptions, TurnProcessor, capture_problem, judged_dispatch
from .teachers import teacher_prompt_ids

if TYPE_CHECKING:
    from .algorithm import TrainTurn

# The training code (``.algorithm``, ``.loss``, reef_train's learner: torch) is imported where it
# runs, not here: checking a configuration's options reads this class's signature (``reef
# config``, every command that composes a served configuration), which must not cost torch's import.

HintSelection = Literal["shortest", "token_optimal", "sequence_optimal"]
SubsetMode = Literal["student", "teacher", "overlap"]


class OpenClawRecipe(Recipe):
    """Binary RL from a judge's verdict on the next state plus hindsight-guided distillation."""

    update_target = "adapter"
    default_evaluator = "always"  # as the reference runs it: every step hot-swaps
    keeps_lineage = True

    def __init__(
        self,
        batch_size: int = 16,
        max_batches: int = 1,
        max_staleness: int = lineage.MAX_STALENESS,
        session_ttl_s: float = 900.0,
        max_open_sessions: int = 1000,
        main_turn_requires_tools: bool = False,
        judge: dict[str, Any] | None = None,
        prm_m: int = 3,
        prm_temperature: float = 0.6,
        prm_max_tokens: int = 1024,
        prm_timeout_s: float = 120.0,
        prm_concurrency: int = 8,
        prm_max_hint_candidates: int = 3,
        prm_record_file: str = "",
        top_k: int = 4,
        w_rl: float = 1.0,
        w_opd: float = 1.0,
        adv_diff_clip: float = 1.0,
        hint_selection: HintSelection = "sequence_optimal",
        subset_mode: SubsetMode = "student",
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        lr: float = 1e-5,
        weight_decay: float = 0.1,
        steps_per_batch: int = 1,
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
        #: the policy's LoRA and its AdamW (betas 0.9, 0.98, as the reference)
        self.lora = LoraOptions.from_options(locals(), beta2=0.98)
        #: where the training step runs (``reef_train.make_trainer``: local or ray)
        self.trainer = make_trainer(trainer)
        from .algorithm import OpenClawAlgorithm

        self.batch_size = int(batch_size)
        #: batches one step may take when more are waiting (``Recipe.max_batches``): a learner
        #: step each, one candidate for the lot
        self.max_batches = int(max_batches)
        self.max_staleness = int(max_staleness)
        self.judge = judge if judge is not None else {"name": "runtime"}
        #: the runtime records this many top logprobs per response token for this scenario's traffic
        self.top_logprobs = int(top_k)
        self.processor_options = ProcessorOptions(
            session_ttl_s=float(session_ttl_s), max_open_sessions=int(max_open_sessions),
            main_turn_requires_tools=bool(main_turn_requires_tools), prm_m=int(prm_m),
            prm_temperature=float(prm_temperature), prm_max_tokens=int(prm_max_tokens),
            prm_timeout_s=float(prm_timeout_s), prm_concurrency=int(prm_concurrency),
            prm_max_hint_candidates=int(prm_max_hint_candidates), top_k=int(top_k))
        #: OpenClaw's loss, run by reef_train's learner
        self.algorithm = OpenClawAlgorithm(
            w_rl=float(w_rl), w_opd=float(w_opd), adv_diff_clip=float(adv_diff_clip), hint_selection=hint_selection,
            subset_mode=subset_mode, clip_low=float(clip_low), clip_high=float(clip_high),
            steps_per_batch=int(steps_per_batch))
        self.state_root = Path(state_dir) / "openclaw" if state_dir is not None else None
        #: the learner lineage of each scenario (docs/learning.md): each batch trains on its head
        #: and advances it, whether or not the gate publishes the candidate
        self.lineages = lineage.lineages_in(state_dir)
        self.prm_record_file = prm_record_file

    @classmethod
    def option_problems(cls, o: dict[str, Any]) -> list[str]:
        """Every problem of the option values, without building anything (``reef config`` asks)."""
        problems = []
        if o["batch_size"] < 1 or o["steps_per_batch"] < 1 or o["max_batches"] < 1:
            problems.append("batch_size, max_batches and steps_per_batch must be 1 or more")
        if o["max_staleness"] < 0:
            problems.append("max_staleness must be 0 or more")
        if o["session_ttl_s"] <= 0 or o["max_open_sessions"] < 1:
            problems.append("session_ttl_s must be above 0 and max_open_sessions 1 or more")
        if o["prm_m"] < 1 or o["prm_concurrency"] < 1 or o["prm_max_tokens"] < 1 or o["prm_timeout_s"] <= 0:
            problems.append("prm_m, prm_concurrency and prm_max_tokens must be 1 or more, prm_timeout_s above 0")
        if o["prm_temperature"] < 0 or o["prm_max_hint_candidates"] < 0:
            problems.append("prm_temperature and prm_max_hint_candidates must be 0 or more")
        if o["top_k"] < 1:
            problems.append("top_k must be 1 or more (the student's top-K tokens OPD distils over)")
        if o["w_rl"] < 0 or o["w_opd"] < 0 or o["w_rl"] + o["w_opd"] == 0:
            problems.append("w_rl and w_opd must be 0 or more, and not both 0")
        if o["adv_diff_clip"] <= 0 or not 0 < o["clip_low"] < 1 or o["clip_high"] <= 0:
            problems.append("adv_diff_clip and clip_high must be above 0, clip_low in (0, 1)")
        if o["hint_selection"] not in get_args(HintSelection):
            problems.append(f"hint_selection must be one of {', '.join(get_args(HintSelection))}")
        if o["subset_mode"] not in get_args(SubsetMode):
            problems.append("subset_mode must be student, teacher or overlap")
        problems += learner_option_problems(o, beta2=0.98)
        try:
            check_judge_spec(o.get("judge"))
        except ConfigError as exc:
            problems.append(str(exc))
        return problems

    @property
    def filters(self) -> list[Any]:
        return []  # staleness is counted in lineage steps (``propose`` drops stale turns)

    # ------------------------------------------------------------------ computed feedback

    def scenario_dir(self, scenario: str) -> Path | None:
        return self.state_root / _safe(scenario) if self.state_root is not None else None

    def processor(self, scenario: str, judge: Any, store_report: Any) -> TurnProcessor:
        """The computed-feedback processor of ``scenario`` (``service.py`` builds one per scenario)."""
        return TurnProcessor(scenario, self.processor_options, judge, store_report, self.scenario_dir(scenario))

    def record_file(self, scenario: str) -> Path | None:
        """Where each batch's line goes: ``prm_record_file``, else ``<state>/openclaw/<scenario>/batches.jsonl``."""
        if self.prm_record_file:
            return Path(self.prm_record_file)
        d = self.scenario_dir(scenario)
        return d / "batches.jsonl" if d is not None else None

    # ------------------------------------------------------------------ propose

    def turn_of(self, exp: Experience, head: Any = None,
                vocab_size: int | None = None) -> tuple[str | None, dict[str, Any], TrainTurn | None]:
        """(why it does not train, its entry, the turn) for one experience of the batch; a turn
        sampled more than ``max_staleness`` lineage steps behind ``head`` is ``stale``, one whose
        token ids the base model's vocabulary (``vocab_size``) does not hold is ``bad_tokens``."""
        meta = exp.metadata.get(METADATA_KEY) if isinstance(exp.metadata, dict) else None
        if len(exp.records) != 1:
            return "multi_reference", {"report_id": exp.report_id}, None
        rec = exp.records[0]
        if isinstance(meta, dict):  # computed: the judge already dispatched it
            d = judged_dispatch(meta)
            if d is None:  # a client's metadata under the judge's key, not the judge's
                return "bad_metadata", {"record_id": rec.id, "report_id": exp.report_id}, None
            entry = {**meta, "record_id": rec.id, "report_id": exp.report_id, "source": "judge"}
            reward = float(exp.score) if exp.score is not None else d.reward
        else:  # an explicit report: its score is the reward, its feedback text a hint
            score = exp.score
            if score is None or isinstance(score, bool) or not math.isfinite(score):
                return "unscored", {"record_id": rec.id, "report_id": exp.report_id}, None
            text = exp.feedback_text()
            hints = [text[:MAX_HINT_CHARS]] if len(text) > MIN_HINT_CHARS else []
            d = dispatch(int(math.copysign(1, score)) if score else 0, hints)
            reward = float(score)
            entry = {"record_id": rec.id, "source": "report", "report_id": exp.report_id, "hints": hints,
                     "dispatch": d.outcome, "reward": reward}
        entry["dispatch"] = d.outcome
        if not d.trains:
            return "retired", entry, None
        problem = capture_problem(rec, self.top_logprobs, vocab_size)
        if problem in ("no_tokens", "bad_tokens"):
            return problem, entry, None
        entry["lag"] = lineage.lag_of(head, rec.release_id)
        if entry["lag"] > self.max_staleness:
            return "stale", entry, None
        topk = None if problem else [[int(pair[0]) for pair in tok] for tok in rec.top_logprobs]
        from .algorithm import TrainTurn

        turn = TrainTurn(record_id=rec.id, prompt_ids=list(rec.prompt_token_ids),
                         response_ids=list(rec.response_token_ids), temperature=record_temperature(rec),
                         reward=reward, topk_ids=topk, hints=list(d.teachers),
                         logprobs=[float(x) for x in rec.logprobs])
        return None, entry, turn

    def propose(self, batch: Batch, current: ActiveRelease | None, ctx: RecipeContext) -> Candidate | None:
        from reef_train import Sample, StepPayload, run_steps

        head = lineage.continued_head(self.lineages, batch.scenario, current, ctx.log, ctx)
        head, reset = lineage.keep_up(self.lineages, batch.scenario, head, current, self.max_staleness, ctx.log, ctx)
        entries, turns, dropped = [], [], {}
        served = trainable_base(ctx.runtime)
        vocab_size = vocab_size_of(served.base_model().path) if served is not None else None
        for exp in batch:
            reason, entry, turn = self.turn_of(exp, head, vocab_size)
            entries.append(entry)
            if reason:
                dropped[reason] = dropped.get(reason, 0) + 1
                entry["trained"] = False
                entry["why_not"] = reason
            else:
                entry["trained"] = True
                turns.append((exp, turn))
        record = {"at": time.time(), "scenario": batch.scenario, "base_release_id": current.release_id if current
                  else None, "turns": entries, "dropped": dropped,
                  "dispatch": _count(e.get("dispatch") for e in entries),
                  "reward_mean": (sum(t.reward for _, t in turns) / len(turns)) if turns else None}
        if not turns:
            stale = dropped.get("stale", 0)
            ctx.skip(f"nothing to train in this batch ({dropped})", "stale" if stale and stale == len(entries)
                     else "no_usable_rollout", rollouts_stale=stale)
            ctx.log.info("openclaw: %s", ctx.skip_reason)
            self._write_record(batch.scenario, {**record, "candidate": False})
            return None
        runtime = require_trainable(ctx.runtime, ctx.recipe)
        base = runtime.base_model()
        from reef_train import load_tokenizer

        tokenizer = load_tokenizer(base)
        for exp, turn in turns:
            rec = exp.records[0]
            turn.teacher_prompts = [turn.prompt_ids if hint is None else
                                    teacher_prompt_ids(tokenizer, rec.request or {}, rec.route, hint)
                                    for hint in turn.hints]
        # Each batch's AdamW starts afresh from the lineage head's adapter (the serving one without
        # a lineage), as this recipe always trained: the learner/ gives the counters, not the moments.
        bound = lineage.kl_bound(ctx)  # the divergence guard measures the KL to serving on these turns
        payload = StepPayload(self.algorithm, self.lora, self.steps_of([t for _, t in turns]), resume_optimizer=False,
                              kl_samples=[Sample(t.prompt_ids, t.response_ids, t.logprobs) for _, t in turns]
                              if bound is not None else None, kl_temperatures=[t.temperature for _, t in turns])
        adapter, learner_dir, source = lineage.learner_source(head, current, runtime, "openclaw")
        before = read_learner_state(learner_dir, "openclaw") if learner_dir is not None else None
        artifact = ctx.new_artifact()
        with ctx.progress.task(f"openclaw: {len(turns)} turn(s) ({self.trainer.options.backend})", total=1) as bar:
            # a TrainerError (the step failed or was lost on Ray) propagates: the candidate fails
            # with its sentence, nothing is published
            result = run_steps(self.trainer, payload, base=base, adapter=adapter, state=learner_dir, output=artifact,
                               reference=runtime.adapter_of(current), stop=ctx.stopping)
            bar.advance()
        metrics = step_metrics(result["steps"])
        optimizer_steps = metrics.get("steps_detail") or [metrics]
        if not any(s.get("grad_norm", 0.0) > 0 for s in optimizer_steps):
            # nothing to learn from (no reward and no hint to distil): the lineage stays where it is
            ctx.skip("nothing to learn: the gradient is 0 in every optimizer step (no reward signal and no hint to "
                     "distil); the lineage did not move", "nothing_to_learn", rollouts_stale=dropped.get("stale", 0))
            ctx.log.info("openclaw: %s", ctx.skip_reason)
            self._write_record(batch.scenario, {**record, "metrics": metrics, "candidate": False})
            return None
        # off-policy: the turns were sampled from serving, which the lineage may be steps ahead of
        lags = [lineage.lag_of(head, exp.records[0].release_id) for exp, _ in turns]
        metrics.update(lineage_lag_max=max(lags), lineage_lag_mean=sum(lags) / len(lags),
                       rollouts_dropped_stale=dropped.get("stale", 0))
        if result.get("kl") is not None:
            metrics["lineage_kl"] = result["kl"]
        trained = result["counters"]["steps"] - (before.counters["steps"] if before is not None else 0)
        new = lineage.advance(self.lineages, batch.scenario, artifact, head=head, current=current, steps=trained,
                              meta={"recipe": ctx.recipe, "from": source, "reward_mean": metrics["reward_mean"],
                                    "lineage_lag_max": metrics["lineage_lag_max"],
                                    "lineage_lag_mean": metrics["lineage_lag_mean"], "kl": result.get("kl")}, ctx=ctx)
        reset = lineage.guard_kl(self.lineages, batch.scenario, new, current, result.get("kl"), bound, ctx.log,
                                 ctx) or reset
        record.update(metrics=metrics, candidate=True)
        self._write_record(batch.scenario, record)
        ctx.log.info("openclaw: %d turn(s), reward %.3f, loss %.4f (rl %.4f, opd %.4f)", len(turns),
                     metrics["reward_mean"], metrics["loss"], metrics["rl_loss"], metrics["opd_loss"])
        return Candidate(
            scenario=batch.scenario, recipe=ctx.recipe, artifact_dir=artifact,
            base_release_id=current.release_id if current else None,
            summary=(f"openclaw lineage step {new.step}: {len(turns)} turn(s) ({_shown(record['dispatch'])}), reward "
                     f"{metrics['reward_mean']:.3f}, rl {metrics['rl_loss']:.4f}, opd {metrics['opd_loss']:.4f}"
                     + (", loss by optimizer step " + ", ".join(f"{s['loss']:.4f}" for s in optimizer_steps)
                        if len(optimizer_steps) > 1 else "")
                     + f", policy lag max {metrics['lineage_lag_max']}"
                     + (f", {dropped['stale']} stale turn(s) dropped" if dropped.get("stale") else "")),
            metadata={"openclaw": {"metrics": metrics, "turns": entries, "dropped": dropped,
                                   "dispatch": record["dispatch"], "judge": judge_spec(self.judge)[0],
                                   "learner_from": source},
                      "lineage": lineage.candidate_metadata(new, reset=reset, rollouts_stale=dropped.get("stale", 0),
                                                            lags=lags)},
        )

    def steps_of(self, turns: list[TrainTurn]) -> list[list[TrainTurn]]:
        """The learner steps of one candidate: ``batch_size`` turns each, in order (the last may
        be short); more than one when the step took a backlog (``max_batches``)."""
        return [turns[i:i + self.batch_size] for i in range(0, len(turns), self.batch_size)]

    def _write_record(self, scenario: str, record: dict[str, Any]) -> None:
        path = self.record_file(scenario)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")


def step_metrics(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """One candidate's metrics over its learner steps: the last step's losses and norms, turns
    and tokens summed, the reward averaged over every turn (not the last step's)."""
    metrics = dict(steps[-1])
    if len(steps) > 1:
        turns = sum(int(m.get("turns", 0)) for m in steps)
        metrics["reward_mean"] = sum(m["reward_mean"] * int(m.get("turns", 0)) for m in steps) / max(turns, 1)
        for key in ("turns", "tokens", "opd_turns", "optimizer_steps"):
            metrics[key] = sum(int(m.get(key, 0)) for m in steps)
        metrics["learner_steps"] = len(steps)
        metrics["steps_detail"] = [o for m in steps for o in (m.get("steps_detail") or [m])]
    return metrics


def record_temperature(rec: Any) -> float:
    """The temperature the record's logprobs were taken at (the request's, else 1)."""
    t = getattr(rec, "logprobs_temperature", None)
    if t is None:
        t = (rec.request or {}).get("temperature")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 else 1.0


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        if v:
            out[v] = out.get(v, 0) + 1
    return out


def _shown(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name)
