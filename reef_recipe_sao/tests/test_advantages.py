"""SAO's pure functions against hand-written oracles: length-adaptive lambda, skip-observation
GAE (with an injected observation span) and the control arm's group-normalised advantages."""

from __future__ import annotations

import math
import random

import pytest
import torch

from reef_recipe_sao import group_normalized_advantages, length_adaptive_lambda, skip_observation_gae


def gae_oracle(values: list[float], mask: list[int], reward: float, gamma: float, lam: float) -> list[float]:
    """The closed form: A_k = Σ_{j ≥ k} (γλ)^{j−k} δ_j over the action tokens only, with
    δ_j = r_j + γ·V(next action) − V(action j) and the reward on the last action."""
    actions = [t for t, m in enumerate(mask) if m]
    deltas = []
    for j, t in enumerate(actions):
        nxt = values[actions[j + 1]] if j + 1 < len(actions) else 0.0
        r = reward if j == len(actions) - 1 else 0.0
        deltas.append(r + gamma * nxt - values[t])
    out = [0.0] * len(values)
    for k, t in enumerate(actions):
        out[t] = sum((gamma * lam) ** (j - k) * deltas[j] for j in range(k, len(actions)))
    return out


def test_length_adaptive_lambda():
    assert length_adaptive_lambda(1, 1.5) == pytest.approx(1 - 1 / 1.5)
    assert length_adaptive_lambda(100, 1.5) == pytest.approx(1 - 1 / 150)
    assert length_adaptive_lambda(1, 0.5) == 0.0          # 1 − 2 clamps to 0
    assert length_adaptive_lambda(0, 1.5) == 0.0


def test_skip_observation_gae_matches_the_oracle_with_an_observation_span():
    rng = random.Random(7)
    # row 0: prompt (masked out), action, action, observation x3 (a tool result), action, action, pad
    mask = [[0, 0, 1, 1, 0, 0, 0, 1, 1, 0], [0, 1, 1, 1, 1, 1, 1, 1, 0, 0]]
    values = [[rng.uniform(-1, 1) for _ in range(10)] for _ in range(2)]
    rewards, gamma, lams = [1.0, -0.5], 0.9, [0.8, 0.6]
    adv, ret = skip_observation_gae(torch.tensor(values, dtype=torch.float64), torch.tensor(mask, dtype=torch.float64),
                                    rewards, gamma=gamma, lam=lams)
    for i in range(2):
        expected = gae_oracle(values[i], mask[i], rewards[i], gamma, lams[i])
        assert adv[i].tolist() == pytest.approx(expected, abs=1e-12)
        assert ret[i].tolist() == pytest.approx([(a + v) * m for a, v, m in zip(expected, values[i], mask[i])],
                                                abs=1e-12)
    assert adv[0, 4:7].tolist() == [0.0, 0.0, 0.0]         # observation tokens: advantage 0
    # the last action token before the observation bridges to the first one after it
    lam0 = lams[0]
    d3 = gamma * values[0][7] - values[0][3]
    assert adv[0, 3].item() == pytest.approx(d3 + gamma * lam0 * adv[0, 7].item(), abs=1e-12)


def test_monte_carlo_returns_are_the_reward_at_gamma_one():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]])
    values = torch.tensor([[0.3, -0.2, 0.5, 9.0, 0.1]])
    _, ret = skip_observation_gae(values, mask, [0.75], gamma=1.0, lam=1.0)
    assert ret.tolist()[0] == pytest.approx([0.0, 0.75, 0.75, 0.0, 0.75])


def test_group_normalized_advantages():
    adv = group_normalized_advantages([1.0, 0.0, 1.0, 1.0, 0.5], ["a", "a", "b", "b", "c"])
    std = math.sqrt(0.5)  # unbiased std of [1, 0]
    assert adv[0] == pytest.approx(0.5 / (std + 1e-6)) and adv[1] == pytest.approx(-0.5 / (std + 1e-6))
    assert adv[2] == adv[3] == 0.0                           # no variation in the group: no signal
    assert adv[4] is None                                    # a group of one has no baseline
