"""The GEPA run state between growth steps: one JSON document, ``gepa/state.json``.

It holds GEPA's own ``GEPAState`` (candidates, parents, per-task validation scores, Pareto
fronts, round-robin cursors, metric calls used), the seeded RNG that GEPA's Pareto sampling,
minibatch shuffling and merge draw from, the merge proposer's schedule, the lineage Reef records
per candidate (parent, component, minibatch scores, the reflection's raw proposal), the train
examples seen so far, and which candidate is served and which one was proposed.

Every candidate artifact carries a copy (``gepa/state.json``), so the state follows the release
chain; the recipe also keeps a working copy in the state directory, so a step whose candidate is
not published (nothing better found, or the gate rejected it) loses nothing. The newer of the two
(more metric calls spent) wins. JSON rather than GEPA's pickle: an artifact never runs code.

The document's size follows the archive's (each candidate brings its texts, validation scores and
lineage with the reflection's raw answer); everything else in it is bounded. ``prune`` keeps the
archive to the recipe's ``max_archive`` candidates, so the copy every release carries stays bounded
over any number of growth steps.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from gepa.core.state import GEPAState
from gepa.gepa_utils import find_dominator_programs

FORMAT = "reef-gepa/1"
STATE_FILE = Path("gepa") / "state.json"

#: GEPAState fields keyed by validation id (ints in Reef: the task's position in the suite)
_BY_VAL_ID = ("pareto_front_valset",)


def state_to_json(state: GEPAState) -> dict[str, Any]:
    """The parts of ``state`` GEPA needs to resume, as JSON values."""
    if getattr(state, "frontier_type", "instance") != "instance":
        raise ValueError("only GEPA's per-instance Pareto front is persisted")
    return {
        "program_candidates": state.program_candidates,
        "parent_program_for_candidate": state.parent_program_for_candidate,
        "prog_candidate_val_subscores": [{str(k): v for k, v in s.items()} for s in state.prog_candidate_val_subscores],
        "prog_candidate_objective_scores": state.prog_candidate_objective_scores,
        "pareto_front_valset": {str(k): v for k, v in state.pareto_front_valset.items()},
        "program_at_pareto_front_valset": {str(k): sorted(v) for k, v in state.program_at_pareto_front_valset.items()},
        "objective_pareto_front": state.objective_pareto_front,
        "program_at_pareto_front_objectives": {k: sorted(v) for k, v in state.program_at_pareto_front_objectives.items()},
        "list_of_named_predictors": state.list_of_named_predictors,
        "named_predictor_id_to_update_next_for_program_candidate":
            state.named_predictor_id_to_update_next_for_program_candidate,
        "i": state.i,
        "num_full_ds_evals": state.num_full_ds_evals,
        "total_num_evals": state.total_num_evals,
        "num_metric_calls_by_discovery": state.num_metric_calls_by_discovery,
        "adapter_state": dict(state.adapter_state or {}),
    }


def state_from_json(data: dict[str, Any]) -> GEPAState:
    """A ``GEPAState`` from ``state_to_json``'s document, checked as GEPA checks a loaded state."""
    d = dict(data)
    d["prog_candidate_val_subscores"] = [{int(k): float(v) for k, v in s.items()}
                                         for s in d["prog_candidate_val_subscores"]]
    d["pareto_front_valset"] = {int(k): float(v) for k, v in d["pareto_front_valset"].items()}
    d["program_at_pareto_front_valset"] = {int(k): set(v) for k, v in d["program_at_pareto_front_valset"].items()}
    d["program_at_pareto_front_objectives"] = {k: set(v) for k, v in d["program_at_pareto_front_objectives"].items()}
    d.update(frontier_type="instance", pareto_front_cartesian={}, program_at_pareto_front_cartesian={},
             full_program_trace=[], best_outputs_valset=None, evaluation_cache=None,
             validation_schema_version=GEPAState._VALIDATION_SCHEMA_VERSION)
    state = GEPAState.__new__(GEPAState)
    state.__dict__.update(d)
    state.is_consistent()
    return state


def rng_to_json(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def rng_from_json(data: list[Any]) -> random.Random:
    rng = random.Random()
    rng.setstate((data[0], tuple(data[1]), data[2]))
    return rng


def tuples(value: Any) -> Any:
    """JSON lists back into the tuples GEPA's merge log holds."""
    return tuple(tuples(v) for v in value) if isinstance(value, list) else value


def read(path: Path) -> dict[str, Any] | None:
    """The document at ``path``, or None when there is none or it is not this format."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else None


def write(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` at ``path`` atomically (a crash leaves the old document or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str), encoding="utf-8")
    os.replace(tmp, path)


def newest(*docs: dict[str, Any] | None) -> dict[str, Any] | None:
    """The document that spent the most metric calls (the archive only grows); the first on ties."""
    found = [d for d in docs if d is not None]
    if not found:
        return None
    return max(found, key=lambda d: (d["state"]["total_num_evals"], -found.index(d)))


def mean(scores: dict[Any, float], n: int) -> float:
    """A candidate's validation mean over the ``n`` tasks (a task it was not scored on counts 0)."""
    return sum(scores.values()) / n if n else 0.0


def prune(doc: dict[str, Any], keep_at_most: int) -> list[int]:
    """Drop candidates from the archive of ``doc`` until ``keep_at_most`` are left; the old
    indices of the dropped ones, ascending (none when the archive is within the bound).

    Kept first, in this order: the served candidate, the best validation mean, the candidates
    GEPA draws parents and merge pairs from (its Pareto front less the dominated programs), then
    the rest by validation mean, newer first on ties. Kept candidates keep their order and are
    renumbered; every index in the document follows (parents, lineage, the served and pending
    ones, the gate's rejections, the merge log). A parent that was dropped is replaced by its
    nearest kept ancestors, so GEPA's merge still finds common ancestors; the Pareto fronts are
    recomputed over what is kept.
    """
    if keep_at_most < 1:
        raise ValueError("an archive keeps at least one candidate (the served one)")
    st = doc["state"]
    n = len(st["program_candidates"])
    if n <= keep_at_most:
        return []
    tasks = len(st["pareto_front_valset"])
    means = [mean(s, tasks) for s in st["prog_candidate_val_subscores"]]
    served = int(doc["served"])
    best = max(range(n), key=lambda i: (means[i], i == served, -i))
    fronts = {k: set(v) for k, v in st["program_at_pareto_front_valset"].items()}
    leading = set(find_dominator_programs(fronts, means))
    order = sorted(range(n), key=lambda i: (i != served, i != best, i not in leading, -means[i], -i))
    keep = sorted(order[:keep_at_most])
    new = {old: k for k, old in enumerate(keep)}

    # parents, resolved through dropped candidates to their nearest kept ancestors (a parent's
    # index is always below its child's, so one pass in index order resolves every chain)
    resolved: list[list[int]] = []
    for parents in st["parent_program_for_candidate"]:
        out: list[int] = []
        for p in parents:
            if p is None:
                continue
            for q in ([new[p]] if p in new else resolved[p]):
                if q not in out:
                    out.append(q)
        resolved.append(out)

    def parents_of(i: int) -> list[Any]:
        return resolved[i] or ([None] if None in st["parent_program_for_candidate"][i] else [])

    for key in ("program_candidates", "prog_candidate_val_subscores", "prog_candidate_objective_scores",
                "named_predictor_id_to_update_next_for_program_candidate", "num_metric_calls_by_discovery"):
        st[key] = [st[key][i] for i in keep]
    st["parent_program_for_candidate"] = [parents_of(i) for i in keep]
    st["pareto_front_valset"], st["program_at_pareto_front_valset"] = _front(st["prog_candidate_val_subscores"])
    st["objective_pareto_front"], st["program_at_pareto_front_objectives"] = _front(
        st["prog_candidate_objective_scores"])

    doc["served"] = new[served]
    if doc.get("pending") is not None:
        doc["pending"] = new.get(int(doc["pending"]))
    doc["gate_rejected"] = [new[i] for i in doc.get("gate_rejected") or [] if i in new]
    lineage = {}
    for old, k in new.items():
        entry = dict(doc["lineage"].get(str(old)) or {})
        entry["parents"] = [p for p in parents_of(old) if p is not None]
        if entry.get("ancestor") is not None:
            entry["ancestor"] = new.get(int(entry["ancestor"]))
        lineage[str(k)] = entry
    doc["lineage"] = lineage
    if doc.get("merge"):
        def kept(item: Any) -> bool:
            return all(kept(x) for x in item) if isinstance(item, (list, tuple)) else item in new

        def renumber(item: Any) -> Any:
            return [renumber(x) for x in item] if isinstance(item, (list, tuple)) else new[item]

        doc["merge"]["performed"] = [[renumber(x) for x in log if kept(x)] for log in doc["merge"]["performed"]]
    dropped = [i for i in range(n) if i not in new]
    doc["pruned"] = int(doc.get("pruned", 0)) + len(dropped)
    return dropped


def _front(scores: list[dict[str, float]]) -> tuple[dict[str, float], dict[str, list[int]]]:
    """The best score per key over ``scores`` (one dict per candidate) and the candidates that have it."""
    best: dict[str, float] = {}
    for s in scores:
        for k, v in s.items():
            best[k] = max(best.get(k, v), v)
    return best, {k: [i for i, s in enumerate(scores) if k in s and s[k] == v] for k, v in best.items()}
