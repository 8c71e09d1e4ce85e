"""One OpenClaw training step on a batch of judged turns: the LoRA policy against the frozen base.

For each turn the learner needs the served prompt and response token ids, the student's top-K
ids per response token (captured at serving time), the turn's reward and its teachers. The
*teacher* is the frozen initial model — with LoRA, the base with the adapter disabled — on the
original conversation with a hint appended to the last user message (re-templated with the
tokenizer's chat template, as the runtime renders prompts), or on the served prompt itself
(the anchor). It scores the student's own response tokens.

Old log-probabilities are the policy's own before the first update (the "old actor"); with
one optimizer step per batch the importance ratio is exactly 1 at that step. Turns are
forwarded one at a time and their gradients accumulated, so memory stays one sequence's
logits whatever the batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from reef_train import vocab_logprobs

from .loss import openclaw_loss, select_candidates

HINT_PREFIX = "\n\nHint: "
SUBSET_MODES = ("student", "teacher", "overlap")


@dataclass
class LearnerOptions:
    w_rl: float = 1.0
    w_opd: float = 1.0
    adv_diff_clip: float = 1.0
    hint_selection: str = "sequence_optimal"
    subset_mode: str = "student"
    clip_low: float = 0.2
    clip_high: float = 0.28
    lr: float = 1e-5
    weight_decay: float = 0.1
    steps_per_batch: int = 1
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_lm_head: bool = False
    max_grad_norm: float = 1.0
    device: str = "auto"
    seed: int = 0


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


# ---------------------------------------------------------------------- teacher prompts


def openai_messages(request: dict[str, Any], route: str | None) -> list[dict[str, Any]]:
    """The request's conversation in the OpenAI shape the chat template renders (an Anthropic
    request's ``system`` and text blocks become plain messages)."""
    if not (route or "").startswith("anthropic"):
        return [dict(m) for m in request.get("messages") or [] if isinstance(m, dict)]
    out: list[dict[str, Any]] = []
    system = request.get("system")
    if system:
        text = system if isinstance(system, str) else "".join(
            b.get("text", "") for b in system if isinstance(b, dict))
        out.append({"role": "system", "content": text})
    for m in request.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
        out.append({"role": m.get("role"), "content": content or ""})
    return out


def with_hint(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """``messages`` with ``hint`` appended to the last user message (a new user message when
    there is none)."""
    out = [dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                m["content"] = [*content, {"type": "text", "text": HINT_PREFIX + hint}]
            else:
                m["content"] = f"{content or ''}{HINT_PREFIX}{hint}"
            return out
    out.append({"role": "user", "content": HINT_PREFIX.strip() + " " + hint})
    return out


def teacher_prompt_ids(tokenizer: Any, request: dict[str, Any], route: str | None, hint: str) -> list[int]:
    """The hinted conversation rendered as the runtime renders prompts (chat template, generation prompt)."""
    messages = with_hint(openai_messages(request, route), hint)
    text = tokenizer.apply_chat_template(messages, tools=request.get("tools"), add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------- the step


@dataclass
class _Prepared:
    turn: TrainTurn
    old_tok: torch.Tensor
    subset_ids: torch.Tensor | None = None
    subset: torch.Tensor | None = None
    old_s: torch.Tensor | None = None
    teacher_s: torch.Tensor | None = None
    chosen: list[int] = field(default_factory=list)


class Learner:
    """The trainable LoRA policy (continued from the serving adapter) and its optimizer."""

    def __init__(self, options: LearnerOptions, base: Any, adapter_dir: Any = None):
        from reef_train import load_trainable, seed_everything

        if options.subset_mode not in SUBSET_MODES:
            raise ValueError(f"subset_mode must be one of {SUBSET_MODES}, not {options.subset_mode!r}")
        self.options = options
        seed_everything(options.seed)
        lora: dict[str, Any] = {"r": options.lora_rank, "alpha": options.lora_alpha, "seed": options.seed}
        if options.device != "auto":
            lora["device"] = options.device
        self.policy = load_trainable(base, adapter_dir, include_lm_head=options.lora_lm_head, **lora)
        self.device = next(self.policy.parameters()).device
        params = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=options.lr, betas=(0.9, 0.98), weight_decay=options.weight_decay)

    def prepare(self, turn: TrainTurn) -> _Prepared:
        """Old log-probs, the teachers' scores at the student's candidates, the hint selection."""
        o = self.options
        with torch.no_grad():
            self.policy.eval()
            old_full = vocab_logprobs(self.policy, turn.prompt_ids, turn.response_ids, turn.temperature)
            response = torch.tensor(turn.response_ids, device=self.device)
            prep = _Prepared(turn, old_full.gather(-1, response[:, None]).squeeze(-1))
            if turn.topk_ids is None or not turn.teacher_prompts:
                return prep
            k = max(len(ids) for ids in turn.topk_ids)
            teachers = []
            with self.policy.disable_adapter():
                for prompt in turn.teacher_prompts:
                    teachers.append(vocab_logprobs(self.policy, prompt, turn.response_ids, turn.temperature))
            tops = [t.topk(k, dim=-1).indices.tolist() for t in teachers]
            prep.chosen = select_candidates(o.hint_selection, turn.topk_ids, tops)
            subsets = []
            for t, student in enumerate(turn.topk_ids):
                teacher_top = tops[prep.chosen[t]][t]
                if o.subset_mode == "student":
                    subsets.append(list(student))
                elif o.subset_mode == "teacher":
                    subsets.append(list(teacher_top))
                else:
                    subsets.append([v for v in student if v in set(teacher_top)])
            width = max(max((len(s) for s in subsets), default=0), 1)
            ids = torch.zeros((len(subsets), width), dtype=torch.long, device=self.device)
            mask = torch.zeros((len(subsets), width), dtype=torch.bool, device=self.device)
            for t, s in enumerate(subsets):
                if s:
                    ids[t, :len(s)] = torch.tensor(s, dtype=torch.long)
                    mask[t, :len(s)] = True
            chosen = torch.stack([teachers[c][t] for t, c in enumerate(prep.chosen)])  # [R, V]
            prep.subset_ids, prep.subset = ids, mask
            prep.old_s = old_full.gather(-1, ids)
            prep.teacher_s = chosen.gather(-1, ids)
        return prep

    def train(self, turns: Sequence[TrainTurn]) -> dict[str, Any]:
        """``steps_per_batch`` optimizer steps over ``turns``; returns the step's metrics."""
        o = self.options
        prepared = [self.prepare(t) for t in turns]
        total = float(sum(len(t.response_ids) for t in turns))
        metrics: dict[str, Any] = {"turns": len(turns), "tokens": int(total),
                                   "reward_mean": sum(t.reward for t in turns) / max(len(turns), 1),
                                   "opd_turns": sum(p.subset is not None for p in prepared)}
        drift = [float((p.old_tok - torch.tensor(p.turn.logprobs, device=self.device)).abs().mean())
                 for p in prepared if p.turn.logprobs is not None and len(p.turn.logprobs) == len(p.old_tok)]
        if drift:
            metrics["serving_logprob_abs_diff"] = sum(drift) / len(drift)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        history = []
        for _ in range(o.steps_per_batch):
            self.policy.train()
            self.optimizer.zero_grad(set_to_none=True)
            step = {"loss": 0.0, "rl_loss": 0.0, "opd_loss": 0.0, "rl_clip_tokens": 0.0, "opd_adv_mass": 0.0}
            for p in prepared:
                loss, stats = self._turn_loss(p, total)
                loss.backward()
                step["loss"] += float(loss.detach())
                for key, value in stats.items():
                    step[key] += value
            norm = torch.nn.utils.clip_grad_norm_(params, o.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            step["grad_norm"] = float(norm)
            step["rl_clipfrac"] = step.pop("rl_clip_tokens") / max(total, 1.0)
            step["opd_adv_mean"] = step.pop("opd_adv_mass") / max(total, 1.0)
            history.append(step)
        metrics.update(history[-1])
        metrics["optimizer_steps"] = len(history)
        if len(history) > 1:
            metrics["loss_first_step"] = history[0]["loss"]
        return metrics

    def _turn_loss(self, p: _Prepared, denominator: float) -> tuple[torch.Tensor, dict[str, float]]:
        o = self.options
        turn = p.turn
        new_full = vocab_logprobs(self.policy, turn.prompt_ids, turn.response_ids, turn.temperature)
        response = torch.tensor(turn.response_ids, device=self.device)
        new_tok = new_full.gather(-1, response[:, None]).squeeze(-1)
        mask = torch.ones_like(new_tok)
        reward = torch.tensor([turn.reward], device=self.device)
        kwargs: dict[str, Any] = {}
        if p.subset_ids is not None:
            kwargs = {"new_s": new_full.gather(-1, p.subset_ids), "old_s": p.old_s, "teacher_s": p.teacher_s,
                      "subset": p.subset}
        return openclaw_loss(new=new_tok, old=p.old_tok, reward=reward, mask=mask, w_rl=o.w_rl, w_opd=o.w_opd,
                             adv_diff_clip=o.adv_diff_clip, clip_low=o.clip_low, clip_high=o.clip_high,
                             denominator=denominator, **kwargs)

    def save(self, artifact_dir: Any) -> Any:
        from reef_train import save_adapter

        return save_adapter(self.policy, artifact_dir)
