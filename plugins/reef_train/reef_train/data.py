"""What the toolkit learns from: ``Sample`` (one recorded or sampled completion) and
``TokenBatch`` (right-padded samples with per-token masks, logprobs and advantages)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Sample:
    """One recorded (or freshly sampled) completion to learn from.

    ``logprobs`` are the behaviour policy's sampling logprobs (``call.extras["logprobs"]``);
    ``advantage`` is a scalar for the whole response or one value per response token.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None = None
    advantage: float | list[float] = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class TokenBatch:
    """Right-padded ``prompt + response`` sequences; every per-token tensor is aligned with
    ``targets`` (position t predicts ``input_ids[:, t + 1]``), shape ``[B, T - 1]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor

    def to(self, device: Any) -> TokenBatch:
        return TokenBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.targets,
                                                     self.response_mask, self.old_logprobs, self.advantages)))

    def rows(self, rows: Sequence[int]) -> tuple[torch.Tensor, TokenBatch]:
        """``(index, batch)``: the ``rows`` of this batch (an index tensor to put results back
        with), cut to their longest sequence."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.input_ids.device)
        width = int(self.attention_mask[index].sum(dim=1).max())
        cut = slice(0, width - 1)
        return index, TokenBatch(self.input_ids[index, :width], self.attention_mask[index, :width],
                                 self.targets[index, cut], self.response_mask[index, cut],
                                 self.old_logprobs[index, cut], self.advantages[index, cut])


def micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Row indices grouped longest first, each group's ``rows x longest`` within ``budget``
    tokens (a row longer than ``budget`` alone): rows of one prompt pad little together. A loss
    that is a sum over tokens, back-propagated one group at a time, accumulates the whole
    batch's gradient with one group's activations alive at a time."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def collate(samples: Sequence[Sample], pad_id: int, device: Any = "cpu") -> TokenBatch:
    """Pack ``samples`` into a ``TokenBatch`` (missing logprobs become 0, masked anyway)."""
    if not samples:
        raise ValueError("collate() needs at least one sample.")
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    n = len(samples)
    ids = torch.full((n, width), int(pad_id), dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    resp = torch.zeros((n, width - 1), dtype=torch.float32)
    old = torch.zeros((n, width - 1), dtype=torch.float32)
    adv = torch.zeros((n, width - 1), dtype=torch.float32)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        if p == 0 or r == 0:
            raise ValueError(f"Sample {i} needs a non-empty prompt and response.")
        ids[i, : p + r] = torch.tensor(list(s.prompt_ids) + list(s.response_ids))
        attn[i, : p + r] = 1
        span = slice(p - 1, p - 1 + r)  # positions whose next token is a response token
        resp[i, span] = 1.0
        if s.logprobs is not None:
            if len(s.logprobs) != r:
                raise ValueError(f"Sample {i} has {len(s.logprobs)} logprobs for {r} response tokens.")
            old[i, span] = torch.tensor(s.logprobs, dtype=torch.float32)
        if isinstance(s.advantage, (list, tuple)):
            if len(s.advantage) != r:
                raise ValueError(f"Sample {i} has {len(s.advantage)} per-token advantages for {r} tokens.")
            adv[i, span] = torch.tensor(s.advantage, dtype=torch.float32)
        else:
            adv[i, span] = float(s.advantage)
    return TokenBatch(ids, attn, ids[:, 1:].clone(), resp, old, adv).to(device)
