"""OpenClaw's training step on ``reef_train``'s learner: binary RL plus hindsight-guided
distillation (``loss.py``) on a batch of judged turns. The policy, its AdamW and the checkpoint
are ``reef_train.Learner``'s; this module says what the step's advantages and loss are.

For each turn the step needs the served prompt and response token ids, the student's top-K
ids per response token (captured at serving time), the turn's reward and its teachers' prompt
ids (``teachers.py``; the server renders them). The *teacher* is the frozen initial model —
with LoRA, the base with the adapter disabled — on the original conversation with a hint
appended to the last user message, or on the served prompt itself (the anchor). It scores the
student's own response tokens.

Old log-probabilities are the policy's own before the first update (the "old actor"); with
one optimizer step per batch the importance ratio is exactly 1 at that step. Turns are
forwarded one at a time and their gradients accumulated, so memory stays one sequence's
logits whatever the batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from reef_train import Algorithm, Learner, vocab_logprobs

from .loss import HINT_SELECTIONS, openclaw_loss, select_candidates

SUBSET_MODES = ("student", "teacher", "overlap")


@dataclass
class TrainTurn:
    """One judged turn as the learner trains on it."""

    record_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    temperature: float
    reward: float
    #: per response token the student's top-K ids at serving time (None: no capture, RL only)
    topk_ids: list[list[int]] | None
    #: the teachers' prompt ids, one per candidate (the anchor's is ``prompt_ids``)
    teacher_prompts: list[list[int]] = field(default_factory=list)
    #: the hint of each candidate (None: the anchor)
    hints: list[str | None] = field(default_factory=list)
    #: the recorded sampling logprobs (for the drift metric)
    logprobs: list[float] | None = None


@dataclass
class _Prepared:
    turn: TrainTurn
    old_tok: torch.Tensor
    subset_ids: torch.Tensor | None = None
    subset: torch.Tensor | None = None
    old_s: torch.Tensor | None = None
    teacher_s: torch.Tensor | None = None
    chosen: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class OpenClawAlgorithm(Algorithm):
    """``steps_per_batch`` optimizer steps over one batch of judged turns (one learner step)."""

    recipe: ClassVar[str] = "openclaw"
    counters: ClassVar[tuple[str, ...]] = ("turns",)

    w_rl: float = 1.0
    w_opd: float = 1.0
    adv_diff_clip: float = 1.0
    hint_selection: str = "sequence_optimal"
    subset_mode: str = "student"
    clip_low: float = 0.2
    clip_high: float = 0.28
    steps_per_batch: int = 1

    def __post_init__(self) -> None:
        if self.subset_mode not in SUBSET_MODES:
            raise ValueError(f"subset_mode must be one of {SUBSET_MODES}, not {self.subset_mode!r}")
        if self.hint_selection not in HINT_SELECTIONS:
            raise ValueError(f"hint_selection must be one of {HINT_SELECTIONS}, not {self.hint_selection!r}")

    def prepare(self, learner: Learner, turn: TrainTurn) -> _Prepared:
        """Old log-probs, the teachers' scores at the student's candidates, the hint selection."""
        policy, device = learner.policy, learner.device
        with torch.no_grad():
            policy.eval()
            old_full = vocab_logprobs(policy, turn.prompt_ids, turn.response_ids, turn.temperature)
            response = torch.tensor(turn.response_ids, device=device)
            prep = _Prepared(turn, old_full.gather(-1, response[:, None]).squeeze(-1))
            if turn.topk_ids is None or not turn.teacher_prompts:
                return prep
            k = max(len(ids) for ids in turn.topk_ids)
            teachers = []
            with policy.disable_adapter():
                for prompt in turn.teacher_prompts:
                    teachers.append(vocab_logprobs(policy, prompt, turn.response_ids, turn.temperature))
            tops = [t.topk(k, dim=-1).indices.tolist() for t in teachers]
            prep.chosen = select_candidates(self.hint_selection, turn.topk_ids, tops)
            subsets = []
            for t, student in enumerate(turn.topk_ids):
                teacher_top = tops[prep.chosen[t]][t]
                if self.subset_mode == "student":
                    subsets.append(list(student))
                elif self.subset_mode == "teacher":
                    subsets.append(list(teacher_top))
                else:
                    subsets.append([v for v in student if v in set(teacher_top)])
            width = max(max((len(s) for s in subsets), default=0), 1)
            ids = torch.zeros((len(subsets), width), dtype=torch.long, device=device)
            mask = torch.zeros((len(subsets), width), dtype=torch.bool, device=device)
            for t, s in enumerate(subsets):
                if s:
                    ids[t, :len(s)] = torch.tensor(s, dtype=torch.long)
                    mask[t, :len(s)] = True
            chosen = torch.stack([teachers[c][t] for t, c in enumerate(prep.chosen)])  # [R, V]
            prep.subset_ids, prep.subset = ids, mask
            prep.old_s = old_full.gather(-1, ids)
            prep.teacher_s = chosen.gather(-1, ids)
        return prep

    def step(self, learner: Learner, turns: Sequence[TrainTurn]) -> dict[str, Any]:
        """``steps_per_batch`` optimizer steps over ``turns``; returns the step's metrics."""
        prepared = [self.prepare(learner, t) for t in turns]
        total = float(sum(len(t.response_ids) for t in turns))
        metrics: dict[str, Any] = {"turns": len(turns), "tokens": int(total),
                                   "reward_mean": sum(t.reward for t in turns) / max(len(turns), 1),
                                   "opd_turns": sum(p.subset is not None for p in prepared)}
        drift = [float((p.old_tok - torch.tensor(p.turn.logprobs, device=learner.device)).abs().mean())
                 for p in prepared if p.turn.logprobs is not None and len(p.turn.logprobs) == len(p.old_tok)]
        if drift:
            metrics["serving_logprob_abs_diff"] = sum(drift) / len(drift)
        history = []
        for _ in range(self.steps_per_batch):
            learner.policy.train()
            learner.zero_grad()
            step = {"loss": 0.0, "rl_loss": 0.0, "opd_loss": 0.0, "rl_clip_tokens": 0.0, "opd_adv_mass": 0.0}
            for p in prepared:
                loss, stats = self._turn_loss(learner, p, total)
                loss.backward()
                step["loss"] += float(loss.detach())
                for key, value in stats.items():
                    step[key] += value
            step["grad_norm"] = learner.optimizer_step()
            step["rl_clipfrac"] = step.pop("rl_clip_tokens") / max(total, 1.0)
            step["opd_adv_mean"] = step.pop("opd_adv_mass") / max(total, 1.0)
            history.append(step)
        metrics.update(history[-1])
        metrics["optimizer_steps"] = len(history)
        if len(history) > 1:
            metrics["loss_first_step"] = history[0]["loss"]
            metrics["steps_detail"] = history  # every optimizer step, not only the last
        return learner.finish_step(metrics, turns=len(turns))

    def _turn_loss(self, learner: Learner, p: _Prepared, denominator: float) -> tuple[torch.Tensor, dict[str, float]]:
        turn = p.turn
        new_full = vocab_logprobs(learner.policy, turn.prompt_ids, turn.response_ids, turn.temperature)
        response = torch.tensor(turn.response_ids, device=learner.device)
        new_tok = new_full.gather(-1, response[:, None]).squeeze(-1)
        mask = torch.ones_like(new_tok)
        reward = torch.tensor([turn.reward], device=learner.device)
        kwargs: dict[str, Any] = {}
        if p.subset_ids is not None:
            kwargs = {"new_s": new_full.gather(-1, p.subset_ids), "old_s": p.old_s, "teacher_s": p.teacher_s,
                      "subset": p.subset}
        return openclaw_loss(new=new_tok, old=p.old_tok, reward=reward, mask=mask, w_rl=self.w_rl, w_opd=self.w_opd,
                             adv_diff_clip=self.adv_diff_clip, clip_low=self.clip_low, clip_high=self.clip_high,
                             denominator=denominator, **kwargs)
