"""The gate's error rates on a synthetic candidate population, old defaults vs new.

    python bench/gate.py [--tasks 20] [--candidates 200] [--delta 0.15] [--seed 0]

No server and no model: each held-out task has a success probability per side at serving
temperature, and episodes are Bernoulli draws from it. A candidate is known-better,
known-equal or known-worse at serving temperature (its per-task probabilities are the
current release's shifted by about +delta, 0, −delta). Greedy decoding (temperature 0) is
modelled as deterministic and only correlated with serving quality: a side answers a task
correctly greedily when its serving probability plus a fixed per-task offset (uniform in
±0.35, drawn per side) exceeds 0.5 — so a harness can look better greedily than it serves,
as the gate saw in practice.

Each gate configuration decides every candidate with the evaluators' own decision code
(``reef_core.commit.stats``). Reported: false accepts (equal or worse candidates selected),
false rejects (better candidates rejected), and the cost in episodes per candidate.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reef_core.commit.stats import decide, paired_stats, seed_for  # noqa: E402

KINDS = ("better", "equal", "worse")
GREEDY_SPREAD = 0.35


@dataclass(frozen=True)
class Gate:
    label: str
    greedy: bool
    repeats: int
    rule: str
    margin: float = 0.0
    confidence: float = 0.95


GATES = [
    Gate("old defaults: greedy, 1 repeat, wins − losses > 0", True, 1, "wins_minus_losses"),
    Gate("old rule at serving temperature, 1 repeat", False, 1, "wins_minus_losses"),
    Gate("new defaults: serving temperature, 5 repeats, bootstrap 0.95", False, 5, "bootstrap"),
    Gate("sign test 0.95, 5 repeats", False, 5, "sign"),
    Gate("bootstrap 0.95, 10 repeats", False, 10, "bootstrap"),
    Gate("bootstrap 0.90, 3 repeats", False, 3, "bootstrap", confidence=0.90),
]


@dataclass
class Candidate:
    id: str
    kind: str
    current: list[float]  # per-task success probability at serving temperature
    candidate: list[float]
    greedy_current: list[float]  # per-task greedy score (0 or 1)
    greedy_candidate: list[float]


def population(rng: random.Random, n_tasks: int, per_kind: int, delta: float) -> list[Candidate]:
    out = []
    for kind in KINDS:
        sign = {"better": 1.0, "equal": 0.0, "worse": -1.0}[kind]
        for k in range(per_kind):
            cur = [rng.uniform(0.2, 0.8) for _ in range(n_tasks)]
            cand = [min(max(p + sign * rng.uniform(delta - 0.1, delta + 0.1), 0.0), 1.0) for p in cur]

            def greedy(ps: list[float]) -> list[float]:
                return [float(p + rng.uniform(-GREEDY_SPREAD, GREEDY_SPREAD) > 0.5) for p in ps]

            out.append(Candidate(f"bench-{kind}-{k}", kind, cur, cand, greedy(cur), greedy(cand)))
    return out


def episodes(rng: random.Random, ps: list[float], repeats: int) -> list[list[float]]:
    return [[float(rng.random() < p) for _ in range(repeats)] for p in ps]


def run(gate: Gate, candidates: list[Candidate], seed: int) -> dict[str, float]:
    rng = random.Random(f"{seed}:{gate.label}")
    selected = {kind: 0 for kind in KINDS}
    total = {kind: 0 for kind in KINDS}
    # the interval only decides under ``bootstrap``; elsewhere fewer resamples keep the bench quick
    resamples = 2000 if gate.rule == "bootstrap" else 200
    for c in candidates:
        if gate.greedy:
            cand = [[s] * gate.repeats for s in c.greedy_candidate]
            cur = [[s] * gate.repeats for s in c.greedy_current]
        else:
            cand = episodes(rng, c.candidate, gate.repeats)
            cur = episodes(rng, c.current, gate.repeats)
        stats = paired_stats(cand, cur, confidence=gate.confidence,
                             sign_margin=gate.margin if gate.rule == "sign" else 0.0,
                             seed=seed_for(c.id), resamples=resamples)
        ok, _ = decide(stats, gate.rule, gate.margin)
        selected[c.kind] += ok
        total[c.kind] += 1
    n_tasks = len(candidates[0].current)
    return {"accept_equal": selected["equal"] / total["equal"], "accept_worse": selected["worse"] / total["worse"],
            "reject_better": 1.0 - selected["better"] / total["better"], "episodes": 2 * n_tasks * gate.repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20, help="held-out tasks per evaluation")
    parser.add_argument("--candidates", type=int, default=200, help="candidates of each kind")
    parser.add_argument("--delta", type=float, default=0.15, help="mean per-task change of better/worse candidates")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    candidates = population(rng, args.tasks, args.candidates, args.delta)
    true_gain = {kind: sum(sum(c.candidate) - sum(c.current) for c in candidates if c.kind == kind)
                 / (args.tasks * args.candidates) for kind in KINDS}
    started = time.perf_counter()
    rows = [(gate, run(gate, candidates, args.seed)) for gate in GATES]
    print(f"{args.candidates} candidates of each kind, {args.tasks} tasks; true mean change at serving "
          f"temperature: better {true_gain['better']:+.3f}, equal {true_gain['equal']:+.3f}, "
          f"worse {true_gain['worse']:+.3f}")
    print()
    head = f"| {'gate':<62} | {'accepts equal':>13} | {'accepts worse':>13} | {'rejects better':>14} | {'episodes':>8} |"
    print(head)
    print("|" + "|".join("-" * (len(cell)) for cell in head.split("|")[1:-1]) + "|")
    for gate, r in rows:
        print(f"| {gate.label:<62} | {r['accept_equal']:>13.1%} | {r['accept_worse']:>13.1%} | "
              f"{r['reject_better']:>14.1%} | {r['episodes']:>8} |")
    print()
    old, new = rows[0][1], rows[2][1]
    print(f"summary: new defaults accept {new['accept_equal']:.1%} of equal and {new['accept_worse']:.1%} of worse "
          f"candidates and reject {new['reject_better']:.1%} of better ones (old defaults: {old['accept_equal']:.1%}, "
          f"{old['accept_worse']:.1%}, {old['reject_better']:.1%}) for {new['episodes'] / old['episodes']:g}× the "
          f"episodes ({new['episodes']} vs {old['episodes']} per candidate); {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
