"""The gate's statistics: paired candidate-vs-current comparisons over held-out tasks.

Pure functions on scores, no model and no I/O, so the evaluators and ``bench/gate.py``
decide with the same code. The unit is the task: each side's episodes of a task are
averaged over the repeats (a crashed episode scores 0), and the decision looks at the
per-task differences candidate − current.

Rules (``RULES``):

- ``bootstrap``: a paired bootstrap over tasks of the mean per-task difference gives an
  equal-tailed interval at ``confidence``; select when its lower bound is above ``margin``
  (score units). An equal candidate passes about (1 − confidence) / 2 of the time.
- ``sign``: an exact one-sided sign test over tasks whose difference is above / below
  ``margin``; select when p ≤ (1 − confidence) / 2, the same error rate as ``bootstrap``.
- ``wins_minus_losses``: the rule the gate had first: select when wins − losses > ``margin``
  (a count of tasks). No notion of noise: one lucky sample decides.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from statistics import NormalDist

RULES = ("bootstrap", "sign", "wins_minus_losses")

#: bootstrap resamples: enough that the interval's ends move by well under 0.01 between seeds
RESAMPLES = 2000

Scores = Sequence[float | None]


def seed_for(text: str) -> int:
    """A stable 64-bit seed from a string (a candidate id): the same id, the same interval."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def task_mean(scores: Scores) -> float:
    """One side's mean over a task's repeats, a crashed episode (None) counting as 0."""
    return math.fsum(s or 0.0 for s in scores) / len(scores) if scores else 0.0


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolating linearly between neighbours."""
    if not ordered:
        raise ValueError("quantile of no values")
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def student_t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with ``df`` (a positive integer) degrees of freedom, exactly
    (the finite series of Abramowitz & Stegun 26.7.3 and 26.7.4)."""
    if df < 1:
        raise ValueError("df must be 1 or more")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd
        term, total = math.cos(theta), 0.0
        if df > 1:
            total = term
            for k in range(3, df - 1, 2):
                term *= c2 * (k - 1) / k
                total += term
        a = 2.0 / math.pi * (theta + s * total)
    else:
        term = total = 1.0
        for k in range(2, df - 1, 2):
            term *= c2 * (k - 1) / k
            total += term
        a = s * total
    return 0.5 + math.copysign(a / 2.0, t)


@lru_cache(maxsize=256)
def student_t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be between 0 and 1")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if student_t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2.0


def expanded_z(tail: float, n: int) -> float:
    """The normal quantile a bootstrap of ``n`` values uses for a one-sided ``tail``, expanded
    for a small sample (Hesterberg's expanded percentile interval): √(n / (n − 1)) · t(n − 1),
    so that the bootstrap's spread (which divides by n, not n − 1) and the normal's thin tails
    do not make the interval too narrow with few tasks."""
    if n < 2:
        return NormalDist().inv_cdf(1.0 - tail)
    return math.sqrt(n / (n - 1)) * student_t_quantile(1.0 - tail, n - 1)


def bootstrap_interval(diffs: Sequence[float], *, confidence: float = 0.95, resamples: int = RESAMPLES,
                       seed: int = 0) -> tuple[float, float]:
    """An equal-tailed interval of the mean of ``diffs`` at ``confidence`` from ``resamples``
    resamples with replacement (a generator seeded with ``seed``): the wider of the expanded
    percentile interval (``expanded_z``) and the normal one, mean ± the same quantile × the
    resampled means' sd. The percentile ends follow a skewed distribution; the normal ones
    do not move with the few resamples beyond a small tail (at the small error rates a look
    of a sequential gate spends, a percentile from 2,000 resamples rests on a handful of them,
    and that noise alone would select an equal candidate more often than stated)."""
    if not diffs:
        return 0.0, 0.0
    first = diffs[0]
    if all(d == first for d in diffs):  # nothing varies: every resample has this mean
        return float(first), float(first)
    n = len(diffs)
    # one draw of every resample's picks, then the resamples' means: the same random sequence
    # (and intervals) as a draw per resample, a third less time
    picks = random.Random(seed).choices(diffs, k=n * resamples)
    means = sorted(math.fsum(picks[i:i + n]) / n for i in range(0, n * resamples, n))
    z = expanded_z((1.0 - confidence) / 2.0, n)
    tail = 1.0 - NormalDist().cdf(z)
    centre = math.fsum(diffs) / n
    middle = math.fsum(means) / resamples
    spread = z * math.sqrt(math.fsum((m - middle) ** 2 for m in means) / resamples)
    return min(quantile(means, tail), centre - spread), max(quantile(means, 1.0 - tail), centre + spread)


def sign_test(above: int, below: int, *, alternative: str = "greater") -> float:
    """Exact sign test p-value: ``above`` successes of ``above + below`` fair coin flips.

    ``greater``: P(X ≥ above); ``two-sided``: twice the smaller tail, at most 1. Ties are
    left out before calling (they carry no sign)."""
    n = above + below
    if n == 0:
        return 1.0
    upper = math.fsum(math.comb(n, k) for k in range(above, n + 1)) / 2.0 ** n
    if alternative == "greater":
        return min(upper, 1.0)
    if alternative != "two-sided":
        raise ValueError("alternative must be 'greater' or 'two-sided'")
    lower = math.fsum(math.comb(n, k) for k in range(0, above + 1)) / 2.0 ** n
    return min(2.0 * min(upper, lower), 1.0)


@dataclass(frozen=True)
class PairedStats:
    """What a paired comparison measured; ``to_metrics`` is what the evaluation records.

    ``improvement`` is the mean per-task difference candidate − current, ``low``/``high``
    its bootstrap interval at ``confidence``; ``wins``/``losses``/``ties`` compare each
    task's means (equal means: fewer crashes wins); ``above``/``below`` count the tasks whose
    difference is above / below ``sign_margin``, and ``p_value`` is their one-sided sign test.
    """

    n_tasks: int
    repeats: int
    candidate_mean: float
    current_mean: float
    improvement: float
    low: float
    high: float
    confidence: float
    wins: int
    losses: int
    ties: int
    above: int
    below: int
    sign_margin: float
    p_value: float
    seed: int

    def to_metrics(self) -> dict[str, object]:
        m = asdict(self)
        m["interval"] = [m.pop("low"), m.pop("high")]
        return m

    @classmethod
    def from_metrics(cls, metrics: dict[str, object]) -> PairedStats:
        low, high = metrics["interval"]  # type: ignore[misc]
        names = [f for f in cls.__dataclass_fields__ if f not in ("low", "high")]
        return cls(low=low, high=high, **{f: metrics[f] for f in names})  # type: ignore[arg-type]


def paired_stats(candidate: Sequence[Scores], current: Sequence[Scores], *, confidence: float = 0.95,
                 sign_margin: float = 0.0, seed: int = 0, resamples: int = RESAMPLES) -> PairedStats:
    """Compare per-task episode scores (``candidate[i]``: task i's repeats; None = crashed)."""
    if len(candidate) != len(current) or not candidate:
        raise ValueError("paired_stats needs the same tasks, at least one, on both sides")
    cand = [task_mean(s) for s in candidate]
    cur = [task_mean(s) for s in current]
    diffs = [c - k for c, k in zip(cand, cur)]
    wins = losses = 0
    for c, k, cs, ks in zip(cand, cur, candidate, current):
        # equal means: the side that crashed less did better (with one repeat, a crash loses to a 0)
        rank_c, rank_k = (c, k) if c != k else (-sum(s is None for s in cs), -sum(s is None for s in ks))
        wins += rank_c > rank_k
        losses += rank_c < rank_k
    above = sum(d > sign_margin for d in diffs)
    below = sum(d < sign_margin for d in diffs)
    low, high = bootstrap_interval(diffs, confidence=confidence, resamples=resamples, seed=seed)
    n = len(diffs)
    return PairedStats(n_tasks=n, repeats=max(len(s) for s in candidate), candidate_mean=math.fsum(cand) / n,
                       current_mean=math.fsum(cur) / n, improvement=math.fsum(diffs) / n, low=low, high=high,
                       confidence=confidence, wins=wins, losses=losses, ties=n - wins - losses, above=above,
                       below=below, sign_margin=sign_margin, p_value=sign_test(above, below), seed=seed)


def _pct(confidence: float) -> str:
    return f"{confidence * 100:g}%"


def decide(stats: PairedStats, rule: str, margin: float) -> tuple[bool, str]:
    """Select or not under ``rule``, and the reason as one sentence stating the numbers."""
    over = f"{stats.n_tasks} task(s) × {stats.repeats} repeat(s)"
    interval = (f"mean improvement {stats.improvement:+.3f}, {_pct(stats.confidence)} interval "
                f"[{stats.low:+.3f}, {stats.high:+.3f}] over {over}")
    if rule == "bootstrap":
        ok = stats.low > margin
        return ok, (f"{interval} (paired bootstrap): the lower bound is {'above' if ok else 'not above'} "
                    f"margin {margin:g}")
    if rule == "sign":
        alpha = (1.0 - stats.confidence) / 2.0
        ok = stats.p_value <= alpha
        return ok, (f"{stats.above} task(s) above margin {margin:g} and {stats.below} below: one-sided sign "
                    f"test p = {stats.p_value:.4f}, {'within' if ok else 'not within'} {alpha:g} "
                    f"({_pct(stats.confidence)} confidence); {interval}")
    if rule == "wins_minus_losses":
        diff = stats.wins - stats.losses
        ok = diff > margin
        return ok, (f"wins {stats.wins} − losses {stats.losses} = {diff}, "
                    f"{'above' if ok else 'not above'} margin {margin:g} ({interval})")
    raise ValueError(f"unknown decision rule {rule!r}; known: {', '.join(RULES)}")
