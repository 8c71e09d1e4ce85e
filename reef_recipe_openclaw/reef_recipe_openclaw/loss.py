"""OpenClaw's loss: binary RL plus hindsight-guided on-policy distillation (OPD).

    loss = w_rl · RL + w_opd · OPD

**RL** — PPO's clipped surrogate (``reef_train.clipped_surrogate``) on the sampled response
tokens; the advantage is the turn's raw reward on every response token (no grouping, no
normalisation); the log-ratio is clamped to ±20 before the exponential.

**OPD** — for each response token, the student's top-K ids ``S`` captured at serving time:
importance weights ``w_v = softmax(ℓ_old(S))_v`` (detached), per-candidate advantages
``A_v = clamp(ℓ_teacher(v) − ℓ_old(v), ±adv_diff_clip) · w_v``, a PPO-clipped surrogate per
candidate with the full-vocabulary log-ratio ``ℓ_new(v) − ℓ_old(v)``, *summed* over ``S``.
When the teacher agrees with the student every ``A_v`` is 0 and so is the gradient.

Both terms are token means over the response tokens of the batch; ``*_sums`` give the sums so
a learner can accumulate gradients one turn at a time and divide by the batch's token count.

``select_candidates`` picks which hint candidate teaches each token (``hint_selection``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reef_train import clipped_surrogate, importance_ratios

LOG_RATIO_CLAMP = 20.0
HINT_SELECTIONS = ("shortest", "token_optimal", "sequence_optimal")


def rl_token_terms(new: torch.Tensor, old: torch.Tensor, reward: torch.Tensor, clip_low: float,
                   clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO surrogate (to maximise) and whether the ratio was clipped; shapes ``[..., T]``;
    ``reward`` broadcasts (one per turn, ``[..., 1]``)."""
    ratio = importance_ratios(new, old, log_ratio_clamp=LOG_RATIO_CLAMP)
    return clipped_surrogate(ratio, reward, clip_low, clip_high)


def opd_advantages(teacher: torch.Tensor, old: torch.Tensor, subset: torch.Tensor,
                   adv_diff_clip: float) -> torch.Tensor:
    """``A_v = clamp(ℓ_teacher − ℓ_old, ±clip) · softmax_S(ℓ_old)``, detached; ``[..., T, K]``;
    ``subset`` (bool, same shape) marks the real members of ``S`` (padding gets weight 0)."""
    with torch.no_grad():
        masked_old = old.masked_fill(~subset, float("-inf"))
        weights = torch.softmax(masked_old, dim=-1)
        weights = torch.nan_to_num(weights, nan=0.0) * subset
        diff = (teacher - old).clamp(-adv_diff_clip, adv_diff_clip)
        return (diff * weights).masked_fill(~subset, 0.0)


def opd_token_terms(new: torch.Tensor, old: torch.Tensor, teacher: torch.Tensor, subset: torch.Tensor, *,
                    adv_diff_clip: float, clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token OPD surrogate (to maximise), summed over the candidates ``S`` (``[..., T]``), and
    the per-token advantage mass ``Σ_v |A_v|`` (for metrics)."""
    adv = opd_advantages(teacher, old, subset, adv_diff_clip)
    surrogate, _ = clipped_surrogate(importance_ratios(new, old, log_ratio_clamp=LOG_RATIO_CLAMP), adv, clip_low,
                                     clip_high)
    return surrogate.masked_fill(~subset, 0.0).sum(-1), adv.abs().sum(-1)


def openclaw_loss(*, new: torch.Tensor, old: torch.Tensor, reward: torch.Tensor, mask: torch.Tensor,
                  new_s: torch.Tensor | None = None, old_s: torch.Tensor | None = None,
                  teacher_s: torch.Tensor | None = None, subset: torch.Tensor | None = None,
                  opd_mask: torch.Tensor | None = None, w_rl: float = 1.0, w_opd: float = 1.0,
                  adv_diff_clip: float = 1.0, clip_low: float = 0.2, clip_high: float = 0.28,
                  denominator: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The combined loss over a batch (or one turn of it, with ``denominator`` the batch's token count).

    ``new``/``old``: ``[B, T]`` sampled-token logprobs; ``reward``: ``[B, 1]``; ``mask``: response
    tokens ``[B, T]``. ``new_s``/``old_s``/``teacher_s``/``subset``: ``[B, T, K]`` at the student's
    top-K ids; ``opd_mask`` (default ``mask``): tokens OPD covers (turns without capture: none).
    """
    mask = mask.float()
    denom = float(denominator) if denominator is not None else float(mask.sum().clamp(min=1.0))
    rl, rl_clipped = rl_token_terms(new, old, reward, clip_low, clip_high)
    rl_loss = -(rl * mask).sum() / denom
    stats = {"rl_loss": float(rl_loss.detach()), "rl_clip_tokens": float((rl_clipped.float() * mask).sum())}
    loss = w_rl * rl_loss
    if new_s is not None and w_opd:
        om = (opd_mask if opd_mask is not None else mask).float()
        opd, mass = opd_token_terms(new_s, old_s, teacher_s, subset, adv_diff_clip=adv_diff_clip,
                                    clip_low=clip_low, clip_high=clip_high)
        opd_loss = -(opd * om).sum() / denom
        loss = loss + w_opd * opd_loss
        stats.update(opd_loss=float(opd_loss.detach()), opd_adv_mass=float((mass * om).sum()))
    else:
        stats.update(opd_loss=0.0, opd_adv_mass=0.0)
    return loss, stats


def overlap(student_ids: Sequence[Sequence[int]], teacher_top: Sequence[Sequence[int]]) -> list[int]:
    """Per token, how many of the student's top-K ids are among the teacher's own top-K."""
    return [len(set(s) & set(t)) for s, t in zip(student_ids, teacher_top)]


def select_candidates(mode: str, student_ids: Sequence[Sequence[int]],
                      teacher_tops: Sequence[Sequence[Sequence[int]]]) -> list[int]:
    """Which candidate teaches each response token: ``shortest`` (candidate 0, the shortest
    hint), ``token_optimal`` (per token, the most top-K overlap with the student), or
    ``sequence_optimal`` (the candidate with the most overlap summed over the response). Ties go
    to the shorter hint (the lower index)."""
    n_tokens = len(student_ids)
    if mode not in HINT_SELECTIONS:
        raise ValueError(f"hint_selection must be one of {HINT_SELECTIONS}, not {mode!r}")
    if not teacher_tops:
        raise ValueError("select_candidates needs at least one candidate")
    if mode == "shortest" or len(teacher_tops) == 1:
        return [0] * n_tokens
    overlaps = [overlap(student_ids, top) for top in teacher_tops]
    if mode == "token_optimal":
        return [max(range(len(overlaps)), key=lambda c: (overlaps[c][t], -c)) for t in range(n_tokens)]
    totals = [sum(o) for o in overlaps]
    best = max(range(len(totals)), key=lambda c: (totals[c], -c))
    return [best] * n_tokens
