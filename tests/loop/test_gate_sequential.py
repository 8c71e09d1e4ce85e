"""The sequential gate on simulated scores (pure functions, no model): its error rate across
looks, its power within the cap, and the smallest effect it states it detects.

The population is the one docs/learning.md states its figures for: per task a success
probability p uniform in [0.2, 0.8] for the current release and p + effect for the
candidate, 5 repeats a round at serving temperature, the default cap of 4 rounds, the
default rule (``bootstrap``, confidence 0.95, margin 0).
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from reef_core.commit.sequential import (
    AUTO_ROUNDS,
    Sensitivity,
    Spread,
    assumed_spread,
    detectable_effect,
    gather,
    look_alphas,
    observed_spread,
    selection_problem,
    spent,
)

REPEATS = 5
CONFIDENCE = 0.95
ALPHA = (1 - CONFIDENCE) / 2
#: what docs/learning.md states a +0.1 candidate is selected at, with 24 tasks, within the cap
DOCUMENTED_PLUS_0_1 = 0.73
#: the episode noise of the population: 2 · E[p (1 − p)] for p uniform in [0.2, 0.8]
POPULATION_SPREAD = Spread(0.0, math.sqrt(0.44), "assumed")


def _simulate(runs: int, *, n_tasks: int, effect: float, rounds: int = AUTO_ROUNDS, rule: str = "bootstrap",
              seed: int = 0) -> tuple[Counter, float]:
    """Gate ``runs`` candidates of the population; the outcomes and the mean rounds played."""
    rng = random.Random(seed)
    outcomes: Counter = Counter()
    played = 0
    for run in range(runs):
        current = [rng.uniform(0.2, 0.8) for _ in range(n_tasks)]
        candidate = [p + effect for p in current]

        def play_round(k: int, candidate=candidate, current=current) -> tuple[list[list[float]], list[list[float]]]:
            return ([[float(rng.random() < p) for _ in range(REPEATS)] for p in candidate],
                    [[float(rng.random() < p) for _ in range(REPEATS)] for p in current])

        gathered = gather(play_round, rounds=rounds, rule=rule, margin=0.0, confidence=CONFIDENCE, seed=run)
        outcomes[gathered.outcome] += 1
        played += gathered.rounds_run
    return outcomes, played / runs


def _binomial_upper(n: int, p: float, level: float = 0.99) -> int:
    """The smallest count c with P(Binomial(n, p) ≤ c) ≥ ``level``."""
    total = 0.0
    for c in range(n + 1):
        total += math.comb(n, c) * p ** c * (1 - p) ** (n - c)
        if total >= level:
            return c
    return n


# --------------------------------------------------------------------------- the design


def test_the_looks_spend_the_error_rate_once_in_all():
    for rounds in (1, 2, 4, 7):
        alphas = look_alphas(ALPHA, rounds)
        assert len(alphas) == rounds and math.isclose(sum(alphas), ALPHA)
        assert all(a > b for a, b in zip(alphas, alphas[1:]))  # Pocock-type: early looks a little more
    assert look_alphas(ALPHA, 1) == [ALPHA] and spent(ALPHA, 1.0) == ALPHA and spent(ALPHA, 0.0) == 0.0
    # the first of four looks keeps over a third of alpha: a clear winner still decides at once
    assert look_alphas(ALPHA, AUTO_ROUNDS)[0] > ALPHA / 3
    with pytest.raises(ValueError):
        look_alphas(ALPHA, 0)


# --------------------------------------------------------------------------- error rate and power


def test_an_equal_candidate_is_selected_at_most_at_the_stated_error_rate():
    runs = 800
    outcomes, played = _simulate(runs, n_tasks=12, effect=0.0, seed=11)
    assert outcomes["select"] <= _binomial_upper(runs, ALPHA), outcomes
    assert outcomes["undecided"] > 0.9 * runs and played > 3.5  # most gather every round and stay undecided


def test_an_equal_candidate_under_the_sign_rule_is_selected_at_most_at_the_stated_error_rate():
    runs = 400
    outcomes, _ = _simulate(runs, n_tasks=12, effect=0.0, rule="sign", seed=12)
    assert outcomes["select"] <= _binomial_upper(runs, ALPHA), outcomes


def test_a_plus_0_1_candidate_is_selected_within_the_cap_at_the_documented_rate():
    runs = 300
    outcomes, played = _simulate(runs, n_tasks=24, effect=0.1, seed=13)
    rate = outcomes["select"] / runs
    assert rate >= DOCUMENTED_PLUS_0_1 - 3 * math.sqrt(DOCUMENTED_PLUS_0_1 * (1 - DOCUMENTED_PLUS_0_1) / runs), outcomes
    assert outcomes["reject"] == 0 and played < AUTO_ROUNDS  # winners stop early
    # one pass (today's gate) sees the same improvement about a third of the time
    single, _ = _simulate(runs, n_tasks=24, effect=0.1, rounds=1, seed=13)
    assert single["select"] / runs < rate - 0.2, single


@pytest.mark.parametrize("rounds", [1, AUTO_ROUNDS])
def test_the_detectable_effect_is_selected_at_the_stated_power(rounds):
    sensitivity = Sensitivity.of(24, POPULATION_SPREAD, repeats=REPEATS, rounds=rounds, alpha=ALPHA)
    assert 0.05 < sensitivity.effect < 0.25
    runs = 300
    outcomes, _ = _simulate(runs, n_tasks=24, effect=sensitivity.effect, rounds=rounds, seed=14 + rounds)
    assert abs(outcomes["select"] / runs - 0.8) < 3 * math.sqrt(0.8 * 0.2 / runs), (sensitivity.effect, outcomes)
    assert sensitivity.sentence().startswith(f"with 24 task(s) × 5 repeat(s){', up to 4 round(s),' if rounds > 1 else ''}"
                                             f" this gate detects +{sensitivity.effect:.2f} or more (power 0.8")


def test_the_detectable_effect_shrinks_with_tasks_and_rounds_and_says_how_many_tasks():
    one = Sensitivity.of(24, assumed_spread(greedy=False), repeats=REPEATS, rounds=1, alpha=ALPHA)
    four = Sensitivity.of(24, assumed_spread(greedy=False), repeats=REPEATS, rounds=AUTO_ROUNDS, alpha=ALPHA)
    assert 0.15 < one.effect < 0.2 and four.effect < 0.7 * one.effect  # "+0.17" was the single pass
    need = one.tasks_for(0.1)
    assert detectable_effect(need, one.spread, repeats=REPEATS, rounds=1, alpha=ALPHA) <= 0.1
    assert detectable_effect(need - 1, one.spread, repeats=REPEATS, rounds=1, alpha=ALPHA) > 0.1
    assert one.tasks_for(0.0) is None and four.tasks_for(0.2) < 24
    # greedy, repeats add nothing: a second round is only another look at the same answers
    greedy = Sensitivity.of(24, assumed_spread(greedy=True), repeats=1, rounds=2, alpha=ALPHA)
    assert greedy.effect > Sensitivity.of(24, assumed_spread(greedy=True), repeats=1, rounds=1, alpha=ALPHA).effect


def test_the_spread_is_read_from_paired_episodes():
    rng = random.Random(5)
    shift = [rng.gauss(0, 0.2) for _ in range(400)]  # the true per-task improvements: sd 0.2
    candidate = [[0.5 + s + rng.gauss(0, 0.3) for _ in range(8)] for s in shift]
    current = [[0.5 for _ in range(8)] for _ in shift]
    spread = observed_spread(candidate, current)
    assert spread.source == "observed"
    assert spread.between == pytest.approx(0.2, abs=0.03) and spread.within == pytest.approx(0.3, abs=0.02)
    assert observed_spread([[1.0]] * 3, [[0.0]] * 3) is None  # nothing varied
    assert observed_spread([[1.0, 0.0]], [[0.0, 0.0]]) is None  # one task: no spread across tasks


def test_suites_too_small_to_select_say_so():
    for n in (1, 2, 3):
        assert "can never select" in selection_problem(n, "sign", 0.0, ALPHA, AUTO_ROUNDS)
        assert "give at least" in selection_problem(n, "bootstrap", 0.0, ALPHA, AUTO_ROUNDS)
    assert "it needs at least 7 tasks" in selection_problem(6, "sign", 0.0, ALPHA, AUTO_ROUNDS)
    assert selection_problem(6, "sign", 0.0, ALPHA, 1) is None  # one look keeps the whole alpha
    assert selection_problem(24, "bootstrap", 0.0, ALPHA, AUTO_ROUNDS) is None
    assert "never be above margin 3" in selection_problem(3, "wins_minus_losses", 3, ALPHA, 1)
