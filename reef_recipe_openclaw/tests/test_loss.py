"""The loss on synthetic logits: OPD is flat where the teacher agrees with the student, w_opd=0
is PPO's clipped surrogate, the advantage clamp holds, and the hint selection modes."""

from __future__ import annotations

import pytest
import torch

from reef_recipe_openclaw import openclaw_loss, select_candidates
from reef_recipe_openclaw.loss import opd_advantages

T, V, K = 6, 11, 4


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, V, generator=g, requires_grad=True)
    ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(T)])
    response = torch.randint(0, V, (T,), generator=g)
    return logits, ids, response


def _parts(logits, ids, response):
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, response[:, None]).squeeze(-1), logp.gather(-1, ids)


def test_opd_gives_zero_gradient_when_the_teacher_equals_the_student():
    logits, ids, response = _setup()
    new_tok, new_s = _parts(logits, ids, response)
    old_tok, old_s = new_tok.detach(), new_s.detach()
    subset = torch.ones(T, K, dtype=torch.bool)
    loss, stats = openclaw_loss(new=new_tok, old=old_tok, reward=torch.tensor([1.0]), mask=torch.ones(T),
                                new_s=new_s, old_s=old_s, teacher_s=old_s.clone(), subset=subset, w_rl=0.0, w_opd=1.0)
    loss.backward()
    assert stats["opd_adv_mass"] == 0.0
    assert torch.count_nonzero(logits.grad) == 0
    # a teacher that disagrees does move the student
    logits2, ids2, response2 = _setup()
    new_tok2, new_s2 = _parts(logits2, ids2, response2)
    teacher = new_s2.detach() + torch.linspace(-0.5, 0.5, K)
    loss2, _ = openclaw_loss(new=new_tok2, old=new_tok2.detach(), reward=torch.tensor([0.0]), mask=torch.ones(T),
                             new_s=new_s2, old_s=new_s2.detach(), teacher_s=teacher, subset=subset, w_rl=0.0)
    loss2.backward()
    assert torch.count_nonzero(logits2.grad) > 0


def test_w_opd_zero_is_the_ppo_clipped_surrogate():
    logits, ids, response = _setup(1)
    new_tok, new_s = _parts(logits, ids, response)
    old_tok = new_tok.detach() + torch.linspace(-0.4, 0.4, T)   # ratios away from 1, some clipped
    reward = torch.tensor([-1.0])
    mask = torch.ones(T)
    ours, _ = openclaw_loss(new=new_tok, old=old_tok, reward=reward, mask=mask, new_s=new_s, old_s=new_s.detach(),
                            teacher_s=new_s.detach() + 1.0, subset=torch.ones(T, K, dtype=torch.bool), w_opd=0.0,
                            clip_low=0.2, clip_high=0.28)
    ratio = torch.exp(new_tok - old_tok)                          # PPO's clipped surrogate, by hand
    ref = -torch.minimum(ratio * reward, ratio.clamp(0.8, 1.28) * reward).mean()
    assert float(ours.detach()) == pytest.approx(float(ref.detach()), abs=1e-6)
    g_ours = torch.autograd.grad(ours, logits, retain_graph=True)[0]
    g_ref = torch.autograd.grad(ref, logits)[0]
    assert torch.allclose(g_ours, g_ref, atol=1e-6)


def test_the_per_candidate_advantage_is_clamped_and_weighted():
    old = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0, -1.0]]), -1)
    teacher = old + torch.tensor([[5.0, -5.0, 0.3, 0.0]])
    subset = torch.tensor([[True, True, True, False]])
    adv = opd_advantages(teacher, old, subset, adv_diff_clip=1.0)
    w = torch.softmax(old[0, :3], -1)
    assert torch.allclose(adv[0, :3], torch.tensor([1.0, -1.0, 0.3]) * w, atol=1e-6)
    assert adv[0, 3] == 0.0                        # padding outside S counts for nothing
    assert float(adv.abs().max()) <= 1.0
    assert float(opd_advantages(teacher, old, subset, adv_diff_clip=0.1).abs().max()) <= 0.1 + 1e-7


def test_hint_selection_modes():
    student = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    # candidate 0 (shortest) overlaps little; 1 wins token 0, 2 wins tokens 1 and 2 and the sum
    tops = [[[1, 0, 0], [0, 0, 0], [0, 0, 0]],
            [[1, 2, 3], [4, 0, 0], [0, 0, 0]],
            [[0, 0, 0], [4, 5, 0], [7, 8, 9]]]
    assert select_candidates("shortest", student, tops) == [0, 0, 0]
    assert select_candidates("token_optimal", student, tops) == [1, 2, 2]
    assert select_candidates("sequence_optimal", student, tops) == [2, 2, 2]
    # ties go to the shorter hint
    assert select_candidates("sequence_optimal", student, [tops[1], tops[1]]) == [0, 0, 0]
    with pytest.raises(ValueError):
        select_candidates("best", student, tops)
