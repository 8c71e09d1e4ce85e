"""The sampling convention itself: what ``sample_rows`` returns as a token's logprob."""

from __future__ import annotations

import pytest
import torch

from reef_train import make_generator, sample_rows


def test_logprob_is_temperature_scaled_before_top_p_and_at_t1_for_greedy():
    torch.manual_seed(0)
    logits = torch.randn(3, 11)
    temps, top_ps = [0.0, 0.7, 1.3], [1.0, 0.5, 1.0]
    tokens, logprobs = sample_rows(logits, temps, top_ps, [make_generator(i) for i in range(3)])
    assert tokens[0] == int(logits[0].argmax())
    for i, t in enumerate(temps):
        expected = torch.log_softmax(logits[i] / (t if t > 0 else 1.0), dim=-1)[tokens[i]]
        assert logprobs[i] == pytest.approx(float(expected), abs=1e-6)  # not renormalised over the top-p set


def test_top_p_only_draws_from_the_nucleus_and_seeds_reproduce():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    draws = {sample_rows(logits, [1.0], [0.6], [make_generator(s)])[0][0] for s in range(200)}
    assert draws == {0, 1}  # 0.5 < 0.6, so the nucleus is the two most likely tokens
    a = [sample_rows(logits, [1.0], [1.0], [make_generator(7)])[0][0] for _ in range(5)]
    assert len(set(a)) == 1
    full = {sample_rows(logits, [1.0], [1.0], [make_generator(s)])[0][0] for s in range(200)}
    assert full == {0, 1, 2, 3}


def test_top_k_and_min_p_narrow_the_draw_and_keep_the_logprob_convention():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))

    def draws(top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0) -> set[int]:
        return {sample_rows(logits, [1.0], [top_p], [make_generator(s)], [top_k], [min_p])[0][0] for s in range(200)}

    assert draws(top_k=2) == {0, 1}
    assert draws(top_k=1) == {0}
    assert draws(min_p=0.5) == {0, 1, 2}  # 0.1 < 0.5 * 0.4
    assert draws(top_p=0.65, top_k=3) == {0, 1}  # every filter applies; the narrowest wins
    assert draws(top_k=2, min_p=0.6) == {0, 1}
    assert draws(min_p=1.0) == {0}  # the most likely token always survives
    tokens, logprobs = sample_rows(logits, [1.0], [1.0], [make_generator(3)], [2], [0.0])
    assert logprobs[0] == pytest.approx(float(torch.log_softmax(logits[0], -1)[tokens[0]]), abs=1e-6)
