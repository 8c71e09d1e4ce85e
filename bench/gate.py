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
(``reef_core.commit.stats``; ``reef_core.commit.sequential`` for the gates that gather
evidence in rounds). Reported: false accepts (equal or worse candidates selected), better
candidates not selected (rejected, or left undecided at the cap), the candidates of any kind
left undecided, and the cost in episodes per candidate (the mean: a sequential gate stops
early when the evidence decides). ``--mde`` adds, per gate at serving temperature, the
smallest improvement it states it detects and the share of candidates improved by exactly
that much it selects (0.8 when the statement holds).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reef_core.commit.sequential import Sensitivity, Spread, gather  # noqa: E402
from reef_core.commit.stats import decide, seed_for  # noqa: E402

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
    #: rounds up to the cap (``max_episodes``); one: a single pass
    rounds: int = 1


GATES = [
    Gate("first gate: greedy, 1 repeat, wins − losses > 0", True, 1, "wins_minus_losses"),
    Gate("first rule at serving temperature, 1 repeat", False, 1, "wins_minus_losses"),
    Gate("one pass: serving temperature, 5 repeats, bootstrap 0.95", False, 5, "bootstrap"),
    Gate("sign test 0.95, 5 repeats", False, 5, "sign"),
    Gate("bootstrap 0.95, 10 repeats", False, 10, "bootstrap"),
    Gate("bootstrap 0.90, 3 repeats", False, 3, "bootstrap", confidence=0.90),
    Gate("defaults: 5 repeats a round, up to 4 rounds, bootstrap 0.95", False, 5, "bootstrap", rounds=4),
    Gate("sign test 0.95, 5 repeats a round, up to 4 rounds", False, 5, "sign", rounds=4),
    Gate("bootstrap 0.95, 5 repeats a round, up to 8 rounds", False, 5, "bootstrap", rounds=8),
]
#: per-episode noise of a task's difference in this population: 2 · E[p (1 − p)], p uniform in [0.2, 0.8]
EPISODE_VARIANCE = 0.44


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


def decide_one(gate: Gate, c: Candidate, rng: random.Random, resamples: int) -> tuple[str, int]:
    """The gate's outcome for one candidate and the episodes it spent (both sides)."""
    def play_round(k: int) -> tuple[list[list[float]], list[list[float]]]:
        if gate.greedy:  # deterministic: every round repeats the same answers
            return ([[s] * gate.repeats for s in c.greedy_candidate], [[s] * gate.repeats for s in c.greedy_current])
        return episodes(rng, c.candidate, gate.repeats), episodes(rng, c.current, gate.repeats)

    gathered = gather(play_round, rounds=gate.rounds, rule=gate.rule, margin=gate.margin, confidence=gate.confidence,
                      seed=seed_for(c.id), resamples=resamples)
    outcome = gathered.outcome or ("select" if decide(gathered.stats, gate.rule, gate.margin)[0] else "reject")
    return outcome, 2 * len(c.current) * gate.repeats * gathered.rounds_run


def run(gate: Gate, candidates: list[Candidate], seed: int) -> dict[str, float]:
    rng = random.Random(f"{seed}:{gate.label}")
    outcomes = {kind: {"select": 0, "reject": 0, "undecided": 0} for kind in KINDS}
    spent = 0
    # the interval decides under ``bootstrap`` (and rejects under ``sign``); elsewhere fewer resamples keep it quick
    resamples = 2000 if gate.rule in ("bootstrap", "sign") else 200
    for c in candidates:
        outcome, used = decide_one(gate, c, rng, resamples)
        outcomes[c.kind][outcome] += 1
        spent += used
    per_kind = {kind: sum(o.values()) for kind, o in outcomes.items()}
    return {"accept_equal": outcomes["equal"]["select"] / per_kind["equal"],
            "accept_worse": outcomes["worse"]["select"] / per_kind["worse"],
            "miss_better": 1.0 - outcomes["better"]["select"] / per_kind["better"],
            "undecided": sum(o["undecided"] for o in outcomes.values()) / len(candidates),
            "episodes": spent / len(candidates)}


def detectable(gate: Gate, n_tasks: int, per_kind: int, seed: int) -> tuple[float, float]:
    """The effect ``gate`` states it detects in this population, and the share of candidates
    improved by exactly that much (every task) that it selects."""
    sensitivity = Sensitivity.of(n_tasks, Spread(0.0, math.sqrt(EPISODE_VARIANCE), "assumed"), repeats=gate.repeats,
                                 rounds=gate.rounds, alpha=(1 - gate.confidence) / 2, margin=gate.margin,
                                 rule=gate.rule)
    rng = random.Random(f"{seed}:mde:{gate.label}")
    selected = 0
    for k in range(per_kind):
        cur = [rng.uniform(0.2, 0.8) for _ in range(n_tasks)]
        c = Candidate(f"bench-mde-{k}", "better", cur, [min(p + sensitivity.effect, 1.0) for p in cur], [], [])
        selected += decide_one(gate, c, rng, 2000)[0] == "select"
    return sensitivity.effect, selected / per_kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20, help="held-out tasks per evaluation")
    parser.add_argument("--candidates", type=int, default=200, help="candidates of each kind")
    parser.add_argument("--delta", type=float, default=0.15, help="mean per-task change of better/worse candidates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mde", action="store_true",
                        help="also check each sampled bootstrap/sign gate's stated detectable effect")
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
    head = (f"| {'gate':<62} | {'accepts equal':>13} | {'accepts worse':>13} | {'misses better':>13} | "
            f"{'undecided':>9} | {'episodes':>8} |")
    print(head)
    print("|" + "|".join("-" * (len(cell)) for cell in head.split("|")[1:-1]) + "|")
    for gate, r in rows:
        print(f"| {gate.label:<62} | {r['accept_equal']:>13.1%} | {r['accept_worse']:>13.1%} | "
              f"{r['miss_better']:>13.1%} | {r['undecided']:>9.1%} | {r['episodes']:>8.0f} |")
    print()
    old, one, seq = rows[0][1], rows[2][1], rows[6][1]
    print(f"summary: the defaults (up to 4 rounds) accept {seq['accept_equal']:.1%} of equal and "
          f"{seq['accept_worse']:.1%} of worse candidates and miss {seq['miss_better']:.1%} of better ones for "
          f"{seq['episodes']:.0f} episodes a candidate on average; one pass: {one['accept_equal']:.1%}, "
          f"{one['accept_worse']:.1%}, {one['miss_better']:.1%} for {one['episodes']:.0f}; the first gate "
          f"{old['accept_equal']:.1%}, {old['accept_worse']:.1%}, {old['miss_better']:.1%} for "
          f"{old['episodes']:.0f}; {time.perf_counter() - started:.0f}s")
    if args.mde:
        print()
        print(f"| {'gate':<62} | {'detects':>7} | {'selected at that effect':>23} |")
        print(f"|{'-' * 64}|{'-' * 9}|{'-' * 25}|")
        for gate in GATES:
            if gate.greedy or gate.rule not in ("bootstrap", "sign"):
                continue
            effect, rate = detectable(gate, args.tasks, args.candidates, args.seed)
            print(f"| {gate.label:<62} | {effect:>+7.3f} | {rate:>23.1%} |")


if __name__ == "__main__":
    main()
