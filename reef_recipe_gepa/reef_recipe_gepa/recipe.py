"""The ``gepa`` recipe: GEPA's reflective prompt evolution of the harness, one growth step at a time.

Each growth step resumes one long GEPA run (``archive``): the batch's reports join the train set,
the served harness is synced into the archive (a new seed when it is not the archive's served
candidate), GEPA's engine runs iterations (Pareto parent choice, reflective mutation of one
component round-robin with minibatch acceptance, merge) until the step's metric-call budget is
spent, and the recipe proposes the archive's best-mean candidate when its validation mean beats
the served candidate's. The scenario's evaluator (default ``task_suite``) still decides.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from gepa.core.data_loader import ensure_loader
from gepa.core.state import ValsetEvaluation, initialize_gepa_state
from gepa.lm import TrackingLM
from gepa.logging.experiment_tracker import create_experiment_tracker
from gepa.logging.logger import LoggerProtocol
from gepa.proposer.merge import MergeProposer
from gepa.proposer.reflective_mutation.reflective_mutation import ReflectiveMutationProposer
from gepa.strategies.batch_sampler import EpochShuffledBatchSampler
from gepa.strategies.candidate_selector import CurrentBestCandidateSelector, ParetoCandidateSelector
from gepa.strategies.component_selector import AllReflectionComponentSelector, RoundRobinReflectionComponentSelector
from gepa.strategies.eval_policy import FullEvaluationPolicy
from gepa.utils import CompositeStopper, MaxMetricCallsStopper

from reef_core import ActiveRelease, Batch, Candidate, ConfigError, Recipe, refuse_bad_options
from reef_core.kit import graders_of

from . import RECIPE, archive
from .adapter import ReefHarnessAdapter, component_texts, write_components
from .data import fingerprint, load_valset, train_examples
from .models import check_reflection, reflection_model

log = logging.getLogger("reef.recipe.gepa")


class GepaRecipe(Recipe):
    """Evolves the harness texts with GEPA on live reports, validated on the scenario's task suite."""

    update_target = "harness"
    filters = ("scored",)
    default_evaluator = "task_suite"

    def __init__(self, batch_size: int = 3, components: list[str] | None = None, max_metric_calls: int = 60,
                 max_total_metric_calls: int | None = None, minibatch_size: int = 3,
                 candidate_selection: Literal["pareto", "current_best"] = "pareto",
                 component_selection: Literal["round_robin", "all"] = "round_robin", use_merge: bool = True,
                 max_merge_invocations: int = 5, skip_perfect_score: bool = True, perfect_score: float = 1.0,
                 seed: int = 0, reflection: Any = "runtime", reflection_max_tokens: int = 2048,
                 judge: Literal["reflection", "none"] = "reflection", max_train: int = 50,
                 params: dict[str, Any] | None = None, episode_timeout_s: float = 120.0, concurrency: int = 4,
                 max_archive: int | None = 50, state_dir: Any = None, plugins: Any = None):
        refuse_bad_options(type(self), locals())
        self.batch_size = batch_size
        self.components = list(components) if components else None
        self.max_metric_calls = int(max_metric_calls)
        self.max_total_metric_calls = max_total_metric_calls
        self.minibatch_size = minibatch_size
        self.candidate_selection = candidate_selection
        self.component_selection = component_selection
        self.use_merge = use_merge
        self.max_merge_invocations = max_merge_invocations
        self.skip_perfect_score = skip_perfect_score
        self.perfect_score = perfect_score
        self.seed = seed
        self.reflection = reflection
        self.reflection_max_tokens = reflection_max_tokens
        self.judge = judge
        self.max_train = max_train
        self.params = dict(params or {})
        self.episode_timeout_s = float(episode_timeout_s)
        self.concurrency = concurrency
        self.max_archive = max_archive
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.graders = graders_of(plugins)

    @classmethod
    def option_problems(cls, o: dict[str, Any]) -> list[str]:
        """Every problem of the option values, without building anything (``reef config`` asks)."""
        problems = []
        if o["batch_size"] < 1:
            problems.append("batch_size must be 1 or more")
        if o["minibatch_size"] < 1:
            problems.append("minibatch_size must be 1 or more")
        calls, total = o["max_metric_calls"], o["max_total_metric_calls"]
        if calls < 1:
            problems.append(f"max_metric_calls must be a positive number of episodes per growth step, not {calls}")
        elif total is not None and total < calls:
            problems.append(f"max_total_metric_calls ({total}) is below max_metric_calls ({calls}): the whole run "
                            "could not pay for one step; raise it or set it to null (no limit)")
        components = o["components"]
        for name in components or ():
            if name not in ("system.md", "rules.md") and not (
                    name.startswith("skills/") and name.endswith("/SKILL.md") and name.count("/") == 2):
                problems.append(f"components: {name!r} is not a harness text (system.md, rules.md or "
                                "skills/<name>/SKILL.md)")
        if components is not None and not components:
            problems.append("components must name at least one harness text, or be null (all of them)")
        try:
            check_reflection(o["reflection"])
        except (ValueError, ConfigError) as exc:
            problems.append(str(exc))
        if o["max_train"] < 1 or o["concurrency"] < 1 or o["episode_timeout_s"] <= 0:
            problems.append("max_train and concurrency must be 1 or more, episode_timeout_s positive")
        if o["max_archive"] is not None and o["max_archive"] < 2:
            problems.append(f"max_archive must be 2 or more (the served candidate and a better one), or null "
                            f"(no limit), not {o['max_archive']}")
        return problems

    # ------------------------------------------------------------------ configuration

    def valset(self, settings: Any, scenario: str) -> list[dict[str, Any]]:
        """The scenario's validation set (``evaluator.tasks``); ConfigError naming the key without one."""
        name, options = settings.evaluator_for(scenario)
        sc = settings.scenarios.get(scenario)
        key = (f"scenarios.{scenario}.evaluator_options.tasks" if sc is not None and sc.evaluator
               else "evaluator.tasks")
        return load_valset(options.get("tasks"), str(options.get("grader") or "contains"), self.graders, key)

    def working_file(self, scenario: str) -> Path | None:
        return self.state_dir / "recipes" / RECIPE / scenario / "state.json" if self.state_dir else None

    # ------------------------------------------------------------------ a growth step

    def propose(self, batch: Batch, current: ActiveRelease | None, ctx: Any) -> Candidate | None:
        scenario = batch.scenario
        valset = self.valset(ctx.settings, scenario)
        needed = 2 * self.minibatch_size + len(valset)
        if self.max_metric_calls < needed:
            raise ConfigError(f"recipe.max_metric_calls={self.max_metric_calls} cannot pay for one GEPA iteration here: "
                              f"one costs up to 2 × minibatch_size ({self.minibatch_size}) + the {len(valset)} "
                              f"validation task(s) = {needed} episodes; raise it to at least {needed}")
        harness = current.harness_dir if current is not None else None
        components = self.components or discover_components(harness)
        served = component_texts(harness, components)

        doc = archive.newest(
            archive.read(self.working_file(scenario)) if self.working_file(scenario) else None,
            archive.read(current.path / archive.STATE_FILE) if current is not None and current.path else None)
        vfp = fingerprint(valset)
        if doc is not None and (doc["components"] != components or doc["valset"] != vfp):
            ctx.log.warning("gepa: the %s changed since the archive was built; starting a new archive",
                            "components" if doc["components"] != components else "validation set")
            doc = None

        train = ((doc or {}).get("train") or []) + train_examples(batch)
        train = list({ex["id"]: ex for ex in train}.values())[-self.max_train:]
        if not train:
            return None

        reflection_lm = reflection_model(self.reflection, ctx, max_tokens=self.reflection_max_tokens,
                                         timeout_s=self.episode_timeout_s)
        evaluator_options = ctx.settings.evaluator_for(scenario)[1]
        model = (evaluator_options.get("model") or (getattr(ctx.settings, "runtime", None) or {}).get("model")
                 or "default")
        params = {**(evaluator_options.get("params") or {}), **self.params}
        run_dir = Path(ctx.scratch_dir) / "gepa-run"
        run_dir.mkdir(parents=True, exist_ok=True)
        adapter = ReefHarnessAdapter(ctx, base=current.path if current is not None else None, served=served,
                                     graders=self.graders, judge_lm=reflection_lm if self.judge == "reflection" else None,
                                     model=str(model), params=params, episode_timeout_s=self.episode_timeout_s,
                                     concurrency=self.concurrency, scratch=Path(ctx.scratch_dir) / "episodes",
                                     served_release_id=current.release_id if current is not None else None)

        # ---- resume (or start) the archive, then sync the served harness into it
        if doc is None:
            state = initialize_gepa_state(run_dir=None, logger=_Log(ctx.log), seed_candidate=served,
                                          seed_valset_evaluation=_val_eval(adapter, valset, served))
            doc = {"format": archive.FORMAT, "scenario": scenario, "components": components, "valset": vfp,
                   "served": 0, "pending": None, "gate_rejected": [], "steps": 0,
                   "rng": archive.rng_to_json(_seeded(self.seed)), "merge": None,
                   "lineage": {"0": {"kind": "seed", "parents": [], "reason": "first boot"}}}
            synced = "first boot: the served harness is the archive's seed"
        else:
            state = archive.state_from_json(doc["state"])
            synced = self._sync(doc, state, served, adapter, valset)
        doc["train"] = train
        used_before = state.total_num_evals

        # ---- run GEPA's engine on the step's budget
        limit = used_before + self.max_metric_calls
        if self.max_total_metric_calls is not None:
            limit = min(limit, self.max_total_metric_calls)
        rng = archive.rng_from_json(doc["rng"])
        recorder = _Recorder()
        if state.total_num_evals < limit:
            engine, merge = self._engine(adapter, state, train, valset, rng, reflection_lm, limit, run_dir,
                                         recorder, doc.get("merge"), ctx)
            state.save(str(run_dir))  # GEPA resumes from its run directory
            state = engine.run()
            doc["merge"] = ({"due": merge.merges_due, "tested": merge.total_merges_tested,
                             "performed": [list(x) for x in merge.merges_performed],
                             "last_found": merge.last_iter_found_new_program} if merge else None)
        else:
            ctx.log.info("gepa: the total budget (%s metric calls) is spent; no GEPA iteration this step",
                         self.max_total_metric_calls)
        for idx, info in recorder.accepted.items():
            doc["lineage"][str(idx)] = info
        if self.max_archive is not None:
            doc["state"] = archive.state_to_json(state)
            dropped = archive.prune(doc, self.max_archive)
            if dropped:
                state = archive.state_from_json(doc["state"])
                ctx.log.info("gepa: the archive keeps %d candidates (max_archive); dropped %d", self.max_archive,
                             len(dropped))
        doc["rng"] = archive.rng_to_json(rng)
        doc["steps"] = int(doc.get("steps", 0)) + 1
        budget = {"step_limit": self.max_metric_calls, "step_used": state.total_num_evals - used_before,
                  "total_used": state.total_num_evals, "total_limit": self.max_total_metric_calls,
                  "episodes_run": adapter.episodes}
        doc["budget"] = budget

        # ---- propose the best-mean candidate if it beats the served one on validation
        n = len(valset)
        means = [archive.mean(s, n) for s in state.prog_candidate_val_subscores]
        served_idx = int(doc["served"])
        rejected = set(doc.get("gate_rejected") or [])
        best = max(range(len(means)), key=lambda i: (means[i], i == served_idx, -i))
        doc["pending"] = None
        candidate = None
        if best != served_idx and means[best] > means[served_idx] and best not in rejected:
            doc["pending"] = best
            candidate = self._candidate(ctx, current, doc, state, best, served_idx, means, valset, budget, synced)
        doc["state"] = archive.state_to_json(state)
        if candidate is not None:
            archive.write(Path(candidate.artifact_dir) / archive.STATE_FILE,
                          {**doc, "served": best, "pending": None})
        if self.working_file(scenario) is not None:
            archive.write(self.working_file(scenario), doc)
        if candidate is None:
            ctx.log.info("gepa: %d candidate(s), best mean %.3f vs served %.3f; nothing to propose (%s)",
                         len(means), means[best], means[served_idx], synced)
        return candidate

    # ------------------------------------------------------------------ pieces

    def _sync(self, doc: dict[str, Any], state: Any, served: dict[str, str], adapter: ReefHarnessAdapter,
              valset: list[dict[str, Any]]) -> str:
        """Make ``doc['served']`` the archive's index of the served harness; a harness the archive
        does not serve (an operator edit, a rollback) enters as a new seed, scored on validation."""
        cands = state.program_candidates
        pending = doc.get("pending")
        if cands[int(doc["served"])] == served:
            if pending is not None:  # proposed last step, not published: the gate said no
                doc.setdefault("gate_rejected", []).append(pending)
                return f"candidate {pending} was not published"
            return "the served harness is the archive's served candidate"
        if pending is not None and cands[pending] == served:
            doc["served"] = pending
            return f"candidate {pending} was published"
        evaluation = _val_eval(adapter, valset, served)
        discovered = state.total_num_evals
        state.increment_evals(len(valset))
        state.num_full_ds_evals += 1
        idx = state.update_state_with_new_program(parent_program_idx=[], new_program=served,
                                                  valset_evaluation=evaluation, run_dir=None,
                                                  num_metric_calls_by_discovery_of_new_program=discovered)
        doc["lineage"][str(idx)] = {"kind": "seed", "parents": [],
                                    "reason": "the served harness is not the archive's served candidate"}
        doc["served"] = idx
        return f"the served harness entered the archive as seed {idx}"

    def _engine(self, adapter: ReefHarnessAdapter, state: Any, train: list[dict[str, Any]],
                valset: list[dict[str, Any]], rng: Any, reflection_lm: Any, limit: int, run_dir: Path,
                recorder: _Recorder, merge_doc: dict[str, Any] | None, ctx: Any) -> tuple[Any, MergeProposer | None]:
        from gepa.core.engine import GEPAEngine

        logger = _Log(ctx.log)
        tracker = create_experiment_tracker(use_wandb=False, use_mlflow=False)
        selector = (ParetoCandidateSelector(rng=rng) if self.candidate_selection == "pareto"
                    else CurrentBestCandidateSelector())
        components = (RoundRobinReflectionComponentSelector() if self.component_selection == "round_robin"
                      else AllReflectionComponentSelector())
        reflective = ReflectiveMutationProposer(
            logger=logger, trainset=train, adapter=adapter, candidate_selector=selector, module_selector=components,
            batch_sampler=EpochShuffledBatchSampler(minibatch_size=self.minibatch_size, rng=rng),
            perfect_score=self.perfect_score, skip_perfect_score=self.skip_perfect_score,
            experiment_tracker=tracker, reflection_lm=TrackingLM(reflection_lm), callbacks=[recorder])
        merge = None
        if self.use_merge:
            def evaluator(batch: list[Any], program: dict[str, str]) -> tuple[Any, Any, Any]:
                out = adapter.evaluate(batch, program, capture_traces=False)
                return out.outputs, out.scores, out.objective_scores

            # val_overlap_floor: GEPA merges two candidates only when both were scored on at least
            # that many common validation tasks (5 by default), which a suite of fewer tasks never
            # reaches. Here every candidate is scored on the whole suite, so the whole suite it is.
            merge = MergeProposer(logger=logger, valset=ensure_loader(valset), evaluator=evaluator, use_merge=True,
                                  max_merge_invocations=self.max_merge_invocations, val_overlap_floor=len(valset),
                                  rng=rng, callbacks=[recorder])
            if merge_doc:
                merge.merges_due = int(merge_doc["due"])
                merge.total_merges_tested = int(merge_doc["tested"])
                merge.merges_performed = tuple(list(archive.tuples(x)) for x in merge_doc["performed"])
            recorder.resume_merge(merge, bool((merge_doc or {}).get("last_found")))
        engine = GEPAEngine(
            adapter=adapter, run_dir=str(run_dir), valset=valset, seed_candidate=state.program_candidates[0],
            perfect_score=self.perfect_score, seed=self.seed, reflective_proposer=reflective, merge_proposer=merge,
            frontier_type="instance", logger=logger, experiment_tracker=tracker, callbacks=[recorder],
            track_best_outputs=False, raise_on_exception=True, stop_callback=CompositeStopper(MaxMetricCallsStopper(limit),
                                          _IdleStopper(len(train), self.minibatch_size)),
            val_evaluation_policy=_ResumePolicy())
        return engine, merge

    def _candidate(self, ctx: Any, current: ActiveRelease | None, doc: dict[str, Any], state: Any, best: int,
                   served_idx: int, means: list[float], valset: list[dict[str, Any]], budget: dict[str, Any],
                   synced: str) -> Candidate:
        texts = state.program_candidates[best]
        artifact = ctx.new_artifact()
        (artifact / "harness").mkdir(parents=True, exist_ok=True)
        write_components(artifact / "harness", texts, state.program_candidates[served_idx])
        ids = [v["id"] for v in valset]
        info = dict(doc["lineage"].get(str(best)) or {})
        changed = [name for name in texts if texts[name] != state.program_candidates[served_idx].get(name)]
        metadata = {
            "archive_index": best,
            "served_index": served_idx,
            "parents": info.get("parents", state.parent_program_for_candidate[best]),
            "kind": info.get("kind"),
            "component": info.get("component"),
            "minibatch_scores": {"parent": info.get("minibatch_before"), "candidate": info.get("minibatch_after")},
            "validation": {ids[k]: v for k, v in sorted(state.prog_candidate_val_subscores[best].items())},
            "validation_mean": means[best],
            "served_validation": {ids[k]: v for k, v in sorted(state.prog_candidate_val_subscores[served_idx].items())},
            "served_validation_mean": means[served_idx],
            "raw_proposal": info.get("raw_proposal"),
            "changed_components": changed,
            "archive_size": len(means),
            "budget": budget,
            "sync": synced,
        }
        return Candidate(scenario=ctx.scenario, recipe=ctx.recipe, artifact_dir=artifact,
                         base_release_id=current.release_id if current is not None else None,
                         summary=(f"GEPA candidate {best} ({', '.join(changed) or 'no change'}): validation mean "
                                  f"{means[best]:.3f} vs served {means[served_idx]:.3f}; "
                                  f"{budget['step_used']} metric calls this step, {budget['total_used']} in all"),
                         metadata={"gepa": metadata})


def discover_components(harness: Path | None) -> list[str]:
    """Every harness text the served release has (``system.md`` alone when it has none)."""
    found = []
    if harness is not None:
        found = [n for n in ("system.md", "rules.md") if (harness / n).is_file()]
        found += sorted(p.relative_to(harness).as_posix() for p in harness.glob("skills/*/SKILL.md"))
    return found or ["system.md"]


def _seeded(seed: int) -> Any:
    import random

    return random.Random(seed)


def _val_eval(adapter: ReefHarnessAdapter, valset: list[dict[str, Any]], candidate: dict[str, str]) -> ValsetEvaluation:
    out = adapter.evaluate(valset, candidate, capture_traces=False)
    ids = list(range(len(valset)))
    return ValsetEvaluation(outputs_by_val_id=dict(zip(ids, out.outputs, strict=True)),
                            scores_by_val_id=dict(zip(ids, out.scores, strict=True)),
                            objective_scores_by_val_id=None)


class _IdleStopper:
    """Stops a step after a whole epoch of iterations that spent no metric call: on live traffic
    the served parent's minibatch is free (recorded answers), so a parent perfect on every
    minibatch (``skip_perfect_score``) would otherwise keep the engine spinning for nothing."""

    def __init__(self, train_size: int, minibatch_size: int):
        self.patience = max(1, -(-train_size // minibatch_size)) + 1
        self._seen: tuple[int, int] | None = None
        self._idle = 0

    def __call__(self, state: Any) -> bool:
        now = (state.total_num_evals, len(state.program_candidates))
        self._idle = self._idle + 1 if now == self._seen else 0
        self._seen = now
        return self._idle >= self.patience


class _ResumePolicy(FullEvaluationPolicy):
    """GEPA's full validation, except that the engine's seed evaluation is skipped: the recipe
    scores every seed itself before the engine resumes the archive from its run directory."""

    def get_seed_eval_batch(self, loader: Any) -> list[Any]:
        return []


class _Log(LoggerProtocol):
    def __init__(self, log: logging.Logger):
        self._log = log

    def log(self, message: str) -> None:
        self._log.debug("gepa: %s", message)


class _Recorder:
    """A GEPA callback that records, per accepted candidate, what made it: its parents (and a
    merge's common ancestor), the component mutated, the minibatch scores and the reflection
    model's raw answer.

    It also carries GEPA's merge schedule across growth steps. The engine clears the merge
    proposer's "the last iteration found a new program" flag when it starts, and a merge is only
    tried in the iteration right after one that found a program; with one engine per growth step,
    a candidate accepted in a step's last iteration (the usual case: its validation spends what
    is left of the budget) would never be followed by the merge GEPA scheduled for it. The flag
    the previous step ended with is set back when the step's first iteration starts, just before
    the engine reads it."""

    def __init__(self) -> None:
        self.accepted: dict[int, dict[str, Any]] = {}
        self._state: Any = None
        self._iteration: dict[str, Any] = {}
        self._merge: Any = None
        self._merge_flag = False

    def resume_merge(self, merge: MergeProposer, last_found: bool) -> None:
        self._merge, self._merge_flag = merge, last_found

    def on_iteration_start(self, event: Any) -> None:
        self._state = event["state"]
        self._iteration = {"iteration": event["iteration"]}
        if self._merge is not None:
            self._merge.last_iter_found_new_program = self._merge_flag
            self._merge = None

    def on_candidate_selected(self, event: Any) -> None:
        self._iteration["parent"] = event["candidate_idx"]

    def on_proposal_start(self, event: Any) -> None:
        self._iteration["components"] = list(event["components"])

    def on_proposal_end(self, event: Any) -> None:
        self._iteration["raw"] = dict(event.get("raw_lm_outputs") or {})

    def on_candidate_accepted(self, event: Any) -> None:
        trace = self._state.full_program_trace[-1] if self._state is not None and self._state.full_program_trace else {}
        merged = bool(trace.get("merged"))
        components = self._iteration.get("components") or []
        entities = trace.get("merged_entities") if merged else None
        self.accepted[int(event["new_candidate_idx"])] = {
            "kind": "merge" if merged else "reflective",
            "iteration": self._iteration.get("iteration"),
            "parents": [p for p in event["parent_ids"] if p is not None],
            **({"ancestor": int(entities[2])} if entities else {}),
            "component": None if merged else (components[0] if len(components) == 1 else components),
            "minibatch_before": (trace.get("id1_subsample_scores") if merged else trace.get("subsample_scores")),
            "minibatch_after": (trace.get("new_program_subsample_scores") if merged
                                else trace.get("new_subsample_scores")),
            "raw_proposal": None if merged else (self._iteration.get("raw") or None),
        }
