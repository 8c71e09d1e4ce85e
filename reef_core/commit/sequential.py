"""The gate's sequential design: rounds of the task suite, looks that spend the error rate,
and the smallest improvement a design detects.

Pure functions on numbers, no model and no I/O (like ``reef_core.commit.stats``), so the
evaluators, ``reef doctor`` and ``bench/gate.py`` use the same code.

A **round** runs every task ``repeats`` times on each side; after each round the gate
**looks** at everything measured so far. The one-sided error rate ``alpha`` (an equal
candidate selected; ``(1 - confidence) / 2``) is spread over the planned looks by a
Pocock-type spending function (Lan & DeMets): look ``k`` of ``K`` may spend
``alpha(k / K) - alpha((k - 1) / K)`` with ``alpha(t) = alpha * ln(1 + (e - 1) t)``, and
its interval is taken at ``1 - 2 * look_alpha``. By the union bound, the chance that any
look selects an equal candidate is at most the sum of what the looks spent, ``alpha``,
whatever the correlation between looks (they share episodes), for any rule whose single
look is valid at its level. Pocock's spends evenly, so the first look (today's single pass)
keeps a third of ``alpha`` at four rounds and a clear winner still decides there; an
O'Brien-Fleming spending would keep the first look near 1e-5 and make every winner wait.

At a look the candidate is **selected** when the interval lies above ``margin``,
**rejected** when it lies at or below it (the candidate is no better than ``margin``), and
otherwise the next round runs; at the cap it is **undecided**.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

from .stats import RESAMPLES, PairedStats, Scores, expanded_z, paired_stats, task_mean

#: the rules that look more than once (``wins_minus_losses`` and ``threshold`` know no noise)
SEQUENTIAL_RULES = ("bootstrap", "sign")
#: the spending function (the only one; see the module's docstring for why)
SPENDING = "pocock"
#: rounds ``max_episodes: auto`` plans at serving temperature (one when greedy)
AUTO_ROUNDS = 4
#: the power at which the detectable effect is stated
POWER = 0.8
#: paths of the normal model that ``detectable_effect`` draws for a design of several rounds
PATHS = 4000
#: assumed per-episode variance of a task's candidate − current difference when nothing is
#: measured yet: 0/1 scores at p = 0.5 on both sides (the worst case, 2 · p · (1 − p))
ASSUMED_EPISODE_VARIANCE = 0.5
#: a sign test loses power against the mean difference: its asymptotic relative efficiency
#: for normal differences is 2/π, so its standard error is scaled by √(π/2)
SIGN_INFLATION = math.sqrt(math.pi / 2.0)

_NORMAL = NormalDist()


def spent(alpha: float, fraction: float) -> float:
    """The error rate spent by information fraction ``fraction`` (Pocock-type spending)."""
    t = min(max(fraction, 0.0), 1.0)
    return alpha if t == 1.0 else alpha * math.log1p((math.e - 1.0) * t)


def look_alphas(alpha: float, rounds: int) -> list[float]:
    """The error rate each of ``rounds`` equally spaced looks may spend; they sum to ``alpha``."""
    if rounds < 1:
        raise ValueError("rounds must be 1 or more")
    return [spent(alpha, k / rounds) - spent(alpha, (k - 1) / rounds) for k in range(1, rounds + 1)]


@dataclass
class Gathered:
    """What ``gather`` measured: the last look's ``stats`` (its interval at the level that
    look spent) and ``outcome`` (``select``, ``reject`` or ``undecided``; empty for a rule
    that looks once: its caller decides), the rounds run of ``rounds`` planned, why it stopped
    (``select``, ``reject``, ``cap``, or what ``stop`` said), and every look in brief."""

    stats: PairedStats
    outcome: str
    look_alpha: float
    rounds_run: int
    rounds: int
    stopped: str
    looks: list[dict[str, object]]
    candidate: list[list[float | None]]
    current: list[list[float | None]]


def gather(play_round: Callable[[int], tuple[Sequence[Scores], Sequence[Scores]]], *, rounds: int, rule: str,
           margin: float, confidence: float, seed: int, resamples: int = RESAMPLES,
           stop: Callable[[], str] | None = None) -> Gathered:
    """Play rounds and look after each until a look decides, ``stop`` says why not to go on
    (checked between rounds), or ``rounds`` are played.

    ``play_round(k)`` plays round k (from 0) and returns each side's scores per task for that
    round (``candidate[i]``: task i's repeats); they add to the rounds before. Under a rule of
    ``SEQUENTIAL_RULES`` look k spends its share of ``(1 - confidence) / 2`` (``look_alphas``);
    any other rule (``wins_minus_losses``, ``threshold``) plays one round, measured at
    ``confidence``, and leaves the decision to its caller.
    """
    sequential = rule in SEQUENTIAL_RULES
    rounds = rounds if sequential else 1
    alpha = (1.0 - confidence) / 2.0
    alphas = look_alphas(alpha, rounds)
    candidate: list[list[float | None]] = []
    current: list[list[float | None]] = []
    looks: list[dict[str, object]] = []
    stopped, outcome = "cap", None
    for k in range(rounds):
        cand, cur = play_round(k)
        if not candidate:
            candidate, current = [[] for _ in cand], [[] for _ in cur]
        for mine, new in zip((*candidate, *current), (*cand, *cur)):
            mine.extend(new)
        level = confidence if rounds == 1 else 1.0 - 2.0 * alphas[k]
        stats = paired_stats(candidate, current, confidence=level, sign_margin=margin if rule == "sign" else 0.0,
                             seed=seed, resamples=resamples)
        outcome = look_outcome(stats, rule, margin, alphas[k]) if sequential else None
        looks.append({"round": k + 1, "episodes": 2 * sum(len(c) for c in candidate), "alpha": alphas[k],
                      "improvement": stats.improvement, "interval": [stats.low, stats.high],
                      "outcome": outcome or ("continue" if k + 1 < rounds else "undecided" if sequential else "")})
        if outcome is not None:
            stopped = outcome
            break
        if k + 1 < rounds and stop is not None and (why := stop()):
            stopped = why
            break
    return Gathered(stats=stats, outcome=outcome or ("undecided" if sequential else ""), look_alpha=alphas[len(looks) - 1],
                    rounds_run=len(looks), rounds=rounds, stopped=stopped, looks=looks, candidate=candidate,
                    current=current)


def look_outcome(stats: PairedStats, rule: str, margin: float, alpha: float) -> str | None:
    """``select``, ``reject`` or None (look again) at one look spending ``alpha``; ``stats``
    must hold the interval at ``1 - 2 * alpha``. Rejection wins a tie: a candidate whose
    interval says it is no better than ``margin`` is never published."""
    if stats.high <= margin:
        return "reject"
    if rule == "bootstrap":
        return "select" if stats.low > margin else None
    if rule == "sign":
        return "select" if stats.p_value <= alpha else None
    raise ValueError(f"rule {rule!r} does not look sequentially; sequential rules: {', '.join(SEQUENTIAL_RULES)}")


def look_reason(stats: PairedStats, rule: str, margin: float, outcome: str, *, round_: int, rounds: int,
                stopped: str = "") -> str:
    """One sentence stating the numbers of the last look and what they decided."""
    interval = (f"mean improvement {stats.improvement:+.3f}, {stats.confidence * 100:.4g}% interval "
                f"[{stats.low:+.3f}, {stats.high:+.3f}] over {stats.n_tasks} task(s) × {stats.repeats} repeat(s)"
                + (f", round {round_} of up to {rounds}" if rounds > 1 else ""))
    if rule == "sign":
        alpha = (1.0 - stats.confidence) / 2.0
        head = (f"{stats.above} task(s) above margin {margin:g} and {stats.below} below: one-sided sign test "
                f"p = {stats.p_value:.4f}, {'within' if stats.p_value <= alpha else 'not within'} {alpha:.4g}; "
                f"{interval}")
    else:
        head = f"{interval} (paired bootstrap)"
    if outcome == "select":
        if rule == "sign":
            return f"{head}: more tasks are above margin {margin:g} than chance allows"
        return f"{head}: the lower bound is above margin {margin:g}"
    if outcome == "reject":
        return f"{head}: the upper bound is not above margin {margin:g}, so the candidate is no better"
    why = {"time": "the evaluation's timeout leaves no time for another round",
           "cancelled": "the evaluation was stopped"}.get(stopped, "the cap (max_episodes) is reached")
    return f"{head}: the interval still holds margin {margin:g} and {why}; undecided"


# --------------------------------------------------------------------------- what a design detects


@dataclass(frozen=True)
class Spread:
    """How a task's candidate − current difference varies: ``between`` (sd of the true
    per-task differences) and ``within`` (sd of one episode pair's difference around its
    task's), ``source`` ``observed`` or ``assumed``."""

    between: float
    within: float
    source: str

    def task_sd(self, repeats: int) -> float:
        """The sd of a task's mean difference over ``repeats`` episode pairs."""
        return math.sqrt(self.between ** 2 + self.within ** 2 / max(repeats, 1))


def assumed_spread(greedy: bool) -> Spread:
    """The spread assumed before anything is measured: a 0/1 grader at p = 0.5 on both sides.
    Greedy (a deterministic runtime), repeats measure nothing new, so it is all between tasks."""
    sd = math.sqrt(ASSUMED_EPISODE_VARIANCE)
    return Spread(sd, 0.0, "assumed") if greedy else Spread(0.0, sd, "assumed")


def observed_spread(candidate: Sequence[Scores], current: Sequence[Scores]) -> Spread | None:
    """The spread measured by paired episodes (``candidate[i]``: task i's repeats; a crash
    scores 0): ``within`` from the variance of a task's episode-pair differences about their
    mean, ``between`` from the variance of the task means less what ``within`` explains.
    With one repeat the two cannot be told apart and all of it counts as ``between`` (more
    rounds are then assumed to help nothing). None when fewer than two tasks or nothing varied."""
    n = len(candidate)
    if n < 2:
        return None
    pairs = [[(c or 0.0) - (k or 0.0) for c, k in zip(cs, ks)] for cs, ks in zip(candidate, current)]
    means = [task_mean(c) - task_mean(k) for c, k in zip(candidate, current)]
    grand = math.fsum(means) / n
    var_means = math.fsum((d - grand) ** 2 for d in means) / (n - 1)
    repeats = min(len(p) for p in pairs)
    if repeats >= 2:
        within = math.fsum(math.fsum((x - m) ** 2 for x in p) / (len(p) - 1) for p, m in zip(pairs, means)) / n
        between = max(var_means - within / repeats, 0.0)
    else:
        within, between = 0.0, var_means
    if within == 0.0 and between == 0.0:
        return None
    return Spread(math.sqrt(between), math.sqrt(within), "observed")


def detectable_effect(n_tasks: int, spread: Spread, *, repeats: int, rounds: int, alpha: float,
                      margin: float = 0.0, rule: str = "bootstrap", power: float = POWER,
                      paths: int = PATHS, seed: int = 0) -> float:
    """The true mean improvement the gate selects with probability ``power`` by its cap.

    A normal model of the design: the mean difference at look k is ``effect + B + W_k`` with
    ``B ~ N(0, between² / n)`` shared by every look (the tasks are the same) and ``W_k`` the
    mean of the ``k · repeats`` episode pairs' noise so far (variance ``within² / n`` each).
    A look selects when the difference less z standard errors is above ``margin`` and rejects
    when it plus as many is at or below it, as ``look_outcome`` does, with the quantile the
    bootstrap interval uses (``stats.expanded_z``: t(n − 1) for the look's alpha, expanded).
    One round has a closed form; several are drawn (``paths`` seeded paths: for each the
    smallest effect it selects at, of which the ``power`` quantile). Under ``sign`` the
    standard error is scaled by √(π/2) (the sign test's efficiency).
    """
    if n_tasks < 1:
        raise ValueError("n_tasks must be 1 or more")
    scale = SIGN_INFLATION if rule == "sign" else 1.0
    alphas = look_alphas(alpha, rounds)
    z_power = _NORMAL.inv_cdf(power)
    zs = [expanded_z(a, n_tasks) for a in alphas]
    if rounds == 1:
        se = scale * spread.task_sd(repeats) / math.sqrt(n_tasks)
        return margin + (zs[0] + z_power) * se
    root_n = math.sqrt(n_tasks)
    ses = [scale * spread.task_sd(k * repeats) / root_n for k in range(1, rounds + 1)]
    rng = random.Random(seed)
    sd_between = spread.between / root_n
    sd_round = spread.within * math.sqrt(repeats) / root_n  # of the sum of a round's episode noise
    needed = []
    for _ in range(paths):
        shared = rng.gauss(0.0, sd_between)
        noise = 0.0
        worst_reject = -math.inf
        best = math.inf
        for k in range(rounds):
            noise += rng.gauss(0.0, sd_round)
            level = shared + noise / ((k + 1) * repeats)
            select_above = zs[k] * ses[k] - level
            best = min(best, max(select_above, worst_reject))
            worst_reject = max(worst_reject, -zs[k] * ses[k] - level)
        needed.append(best)
    needed.sort()
    index = min(max(math.ceil(power * paths) - 1, 0), paths - 1)
    return margin + needed[index]


@dataclass(frozen=True)
class Sensitivity:
    """What a gate of ``n_tasks`` tasks × ``repeats`` repeats, up to ``rounds`` rounds, detects."""

    n_tasks: int
    repeats: int
    rounds: int
    alpha: float
    margin: float
    rule: str
    spread: Spread
    effect: float

    @classmethod
    def of(cls, n_tasks: int, spread: Spread, *, repeats: int, rounds: int, alpha: float, margin: float = 0.0,
           rule: str = "bootstrap") -> Sensitivity:
        effect = detectable_effect(n_tasks, spread, repeats=repeats, rounds=rounds, alpha=alpha, margin=margin,
                                   rule=rule)
        return cls(n_tasks, repeats, rounds, alpha, margin, rule, spread, effect)

    @classmethod
    def from_metrics(cls, metrics: dict[str, object]) -> Sensitivity | None:
        """The sensitivity ``to_metrics`` recorded, or None when the metrics hold none."""
        got = metrics.get("sensitivity")
        if not isinstance(got, dict) or "detectable_effect" not in metrics:
            return None
        spread = Spread(float(got["sd_between"]), float(got["sd_within"]), str(got["sd_source"]))
        return cls(int(got["n_tasks"]), int(got["repeats"]), int(got["rounds"]), float(got["alpha"]),
                   float(got["margin"]), str(got["rule"]), spread, float(metrics["detectable_effect"]))  # type: ignore[arg-type]

    def tasks_for(self, target: float) -> int | None:
        """The fewest tasks with which the same design detects ``target``; None when ``target``
        is not above ``margin``. The effect above ``margin`` shrinks about as 1/√tasks (a little
        faster, as t(n − 1) nears the normal), which gives the first guess."""
        if target <= self.margin:
            return None

        def detects(n: int) -> bool:
            return detectable_effect(n, self.spread, repeats=self.repeats, rounds=self.rounds, alpha=self.alpha,
                                     margin=self.margin, rule=self.rule) <= target

        guess = ((self.effect - self.margin) * math.sqrt(self.n_tasks) / (target - self.margin)) ** 2
        low, high = 1, max(math.ceil(guess), 2)
        while not detects(high):
            low, high = high, high * 2
        while high - low > 1:  # detects(high) holds, detects(low) does not (or low is 1)
            mid = (low + high) // 2
            low, high = (low, mid) if detects(mid) else (mid, high)
        return 1 if detects(1) else high

    def sentence(self) -> str:
        rounds = f", up to {self.rounds} round(s)," if self.rounds > 1 else ""
        basis = f"power {POWER:g}, {self.spread.source} per-task sd {self.spread.task_sd(self.repeats):.2f}"
        if self.effect > 1.0:  # graders score in [0, 1]: no candidate can improve by more than 1
            return (f"with {self.n_tasks} task(s) × {self.repeats} repeat(s){rounds} this gate cannot detect "
                    f"even the largest improvement, +1 (it would take {self.effect:+.2f}; {basis})")
        return f"with {self.n_tasks} task(s) × {self.repeats} repeat(s){rounds} this gate detects " \
               f"{self.effect:+.2f} or more ({basis})"

    def to_metrics(self) -> dict[str, object]:
        return {"detectable_effect": round(self.effect, 4),
                "sensitivity": {**{k: v for k, v in asdict(self).items() if k not in ("effect", "spread")},
                                "power": POWER, "sd_between": round(self.spread.between, 4),
                                "sd_within": round(self.spread.within, 4), "sd_source": self.spread.source}}


def never_selects(n_tasks: int, rule: str, margin: float, alpha: float, rounds: int) -> bool:
    """Whether ``n_tasks`` tasks can never select under ``rule``, whatever the episodes score
    (``sign``: fewer tasks than its p-value needs; ``wins_minus_losses``: not more than
    ``margin``; none at all). The bootstrap selects tasks that all improve alike at any size."""
    if n_tasks < 1:
        return True
    if rule == "sign":
        return 2.0 ** -n_tasks > max(look_alphas(alpha, rounds))
    return rule == "wins_minus_losses" and n_tasks <= margin


def selection_problem(n_tasks: int, rule: str, margin: float, alpha: float, rounds: int) -> str | None:
    """Why a suite of ``n_tasks`` tasks can never select under ``rule`` (or only when every
    task improves alike), or None. ``rounds``: the planned looks, whose largest alpha counts.

    ``sign``: ``n`` tasks all above ``margin`` reach p = 2⁻ⁿ at best. ``bootstrap``: the test
    case is every task but one improving from 0 to 1 and one tie; when even that interval
    holds ``margin``, only tasks that all improve alike (an interval of no width) select.
    ``wins_minus_losses``: more than ``margin`` wins are needed."""
    best_alpha = max(look_alphas(alpha, rounds)) if rule in SEQUENTIAL_RULES else alpha
    if rule == "sign" and 2.0 ** -n_tasks > best_alpha:
        need = math.ceil(math.log2(1.0 / best_alpha))
        return (f"the sign test over {n_tasks} task(s) can never select: even with every task better, "
                f"p = {2.0 ** -n_tasks:.3g} is above {best_alpha:.3g}; it needs at least {need} tasks")
    if rule == "bootstrap":
        if n_tasks < 2 or not _all_but_one_selects(n_tasks, margin, best_alpha):
            need = next((n for n in range(2, 1000) if _all_but_one_selects(n, margin, best_alpha)), None)
            give = f"; give at least {need} tasks" if need else ""
            if n_tasks < 2:
                return ("the bootstrap over 1 task has no spread to measure: that task's difference decides alone, "
                        f"so one lucky episode can select{give}")
            return (f"the bootstrap over {n_tasks} task(s) at {1 - 2 * best_alpha:.4g} confidence cannot select even "
                    f"when all tasks but one improve from 0 to 1: only tasks that all improve alike select{give}")
    if rule == "wins_minus_losses" and n_tasks <= margin:
        return f"wins − losses over {n_tasks} task(s) can never be above margin {margin:g}"
    return None


def _all_but_one_selects(n: int, margin: float, alpha: float) -> bool:
    """Whether n − 1 differences of 1 and one of 0 select at ``alpha`` (the bootstrap's normal
    bound, with the resampled means' sd at its expected √(p(1 − p) / n))."""
    mean = (n - 1) / n
    return mean - expanded_z(alpha, n) * math.sqrt(mean * (1.0 - mean) / n) > margin
