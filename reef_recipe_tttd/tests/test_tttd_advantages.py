"""The adaptive-β solve, entropic leave-one-out advantages, the mean baseline and the KL fold."""

from __future__ import annotations

import math

import pytest
import torch

from reef_recipe_tttd.advantages import (
    entropic_loo_advantages,
    fold_kl,
    mean_baseline_advantages,
    softmax_kl_to_uniform,
    solve_beta,
)


@pytest.mark.parametrize("rewards", [[0.0, 0.1, 0.5, 0.9], [1.0, 2.0, 3.0], [0.0, 0.0, 0.0, 1.0, 0.3, 0.31, 0.7, 0.2],
                                     [2.635, 2.62, 2.6, 0.0]])
def test_beta_reaches_kl_ln2(rewards):
    beta = solve_beta(rewards)
    assert beta > 0
    assert softmax_kl_to_uniform(rewards, beta) == pytest.approx(math.log(2), abs=1e-6)


def test_beta_edge_cases():
    assert solve_beta([]) == 0.0 and solve_beta([0.7]) == 0.0
    # two samples: KL only approaches ln 2 as beta grows; the target is capped at ln 2 - 1e-9
    beta = solve_beta([0.0, 1.0])
    assert softmax_kl_to_uniform([0.0, 1.0], beta) == pytest.approx(math.log(2) - 1e-9, abs=1e-7)
    # tiny spreads need large betas: the doubling phase finds them
    assert solve_beta([0.0, 1e-3, 2e-3]) > 1000


def test_loo_advantages_on_known_vectors():
    adv, beta = entropic_loo_advantages([0.0, 1.0], beta=math.log(3))
    # e = [1/3, 1]: A_0 = (1/3)/1 - 1, A_1 = 1/(1/3) - 1
    assert beta == pytest.approx(math.log(3))
    assert adv == pytest.approx([-2 / 3, 2.0])
    adv, _ = entropic_loo_advantages([0.0, 0.0, 1.0], beta=math.log(2))
    # e = [1/2, 1/2, 1]: A_0 = 0.5/0.75 - 1, A_2 = 1/0.5 - 1
    assert adv == pytest.approx([0.5 / 0.75 - 1, 0.5 / 0.75 - 1, 1.0])
    # beta = 0 weights everything the same: no signal
    assert entropic_loo_advantages([0.1, 0.5, 0.9], beta=0.0)[0] == pytest.approx([0.0, 0.0, 0.0], abs=1e-9)
    # constant rewards: no signal whatever beta
    assert entropic_loo_advantages([0.4] * 4)[0] == pytest.approx([0.0] * 4, abs=1e-9)
    assert entropic_loo_advantages([0.3]) == ([0.0], 0.0)


def test_solved_beta_makes_the_best_dominate():
    adv, beta = entropic_loo_advantages([0.1, 0.2, 0.3, 0.9])
    assert adv[3] == max(adv) and adv[3] > 1.0
    assert all(a < 0 for a in adv[:3])


def test_mean_baseline():
    assert mean_baseline_advantages([1.0, 2.0, 3.0]) == pytest.approx([-1.0, 0.0, 1.0])


def test_kl_fold_centres_the_token_penalty():
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    q = torch.tensor([[-1.0, -2.0, 5.0], [-1.0, -1.0, -3.0]])
    base = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -2.0, -1.0]])
    folded, mean_diff = fold_kl(adv * mask, q, base, mask, kl_coef=0.1)
    diff = [0.5, -1.0, 0.0, 1.0, -2.0]  # q - base on the five masked tokens
    assert mean_diff == pytest.approx(sum(diff) / 5)
    expected = torch.tensor([[1 + 0.1 * (mean_diff - 0.5), 1 + 0.1 * (mean_diff + 1.0), 0.0],
                             [-1 + 0.1 * (mean_diff - 0.0), -1 + 0.1 * (mean_diff - 1.0), -1 + 0.1 * (mean_diff + 2.0)]])
    assert torch.allclose(folded, expected)
    # the fold is centred: it moves the masked advantages' sum by nothing
    assert float(((folded - adv * mask) * mask).sum()) == pytest.approx(0.0, abs=1e-6)
    assert torch.equal(fold_kl(adv * mask, q, base, mask, kl_coef=0.0)[0], adv * mask)
