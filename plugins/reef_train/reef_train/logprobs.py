"""Recompute response-token logprobs under a policy, in the runtime's recorded convention.

``log_softmax(logits / T)`` of each target token (see ``reef_train.sampling``), so a freshly
loaded policy reproduces the recorded ``logprobs`` and importance ratios start at 1.
``reference_logprobs`` is the frozen base, through ``with model.disable_adapter()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .data import Sample, TokenBatch, collate


def token_logprobs(model: Any, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / T)`` of each target token, ``[B, T - 1]`` (mask it yourself).

    Gradients flow when called outside ``torch.no_grad()``. ``temperature <= 0`` (greedy
    records) is taken as 1, matching what the runtime records for greedy decoding.
    """
    t = temperature if temperature > 0 else 1.0
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits / t, dim=-1)
    return logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)


def reference_logprobs(model: Any, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
    """Token logprobs under the frozen base model (the adapter disabled), without gradients."""
    with torch.no_grad(), model.disable_adapter():
        return token_logprobs(model, batch, temperature)


def response_logprobs(model: Any, samples: Sequence[Sample], pad_id: int, temperature: float = 1.0) -> list[list[float]]:
    """Per-sample logprobs of the response tokens under ``model`` (no gradients)."""
    device = next(model.parameters()).device
    batch = collate(samples, pad_id, device)
    with torch.no_grad():
        lp = token_logprobs(model, batch, temperature)
    out = []
    for i, s in enumerate(samples):
        start = len(s.prompt_ids) - 1
        out.append(lp[i, start : start + len(s.response_ids)].tolist())
    return out
