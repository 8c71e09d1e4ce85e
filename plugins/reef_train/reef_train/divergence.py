"""How far a trained policy has moved from what serves: the KL the lineage's divergence guard
bounds (docs/learning.md, "The learner lineage").

``kl_to_reference`` estimates KL(serving ‖ policy) per response token on recent rollouts, which
serving sampled: both sides' token logprobs come from ``reef_train.logprobs.token_logprobs``
(the one logprob function), the serving side with the serving release's adapter loaded next to
the trained one (or the adapter disabled when the base model serves). The estimator is
Schulman's k3, ``r - 1 - log r`` with ``r = π_policy / π_serving`` on tokens drawn from serving:
unbiased for that KL, never negative, and low-variance when the two are close.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from .data import Sample, collate
from .logprobs import Temperature, token_logprobs

#: the name the serving adapter is loaded under beside the trained one, for the estimate only
REFERENCE_ADAPTER = "reef_serving"
#: rollouts whose logprobs are computed at once (a grid of hundreds runs in pieces)
KL_ROWS = 16


def kl_to_reference(policy: Any, samples: Sequence[Sample], pad_id: int, temperature: Temperature = 1.0, *,
                    reference_adapter: str | Path | None = None) -> float:
    """The mean per-token KL(reference ‖ ``policy``) over the response tokens of ``samples``
    (drawn from the reference): the reference is ``reference_adapter`` on the same base, or the
    base itself (None). ``policy`` is a PeftModel; it is left with its own adapter active, as
    trainable as it was."""
    if not samples:
        return 0.0
    device = next(policy.parameters()).device
    pieces = []
    for start in range(0, len(samples), KL_ROWS):
        temps = temperature if isinstance(temperature, (int, float)) else list(temperature)[start:start + KL_ROWS]
        pieces.append((collate(samples[start:start + KL_ROWS], pad_id, device), temps))
    was_training = policy.training
    policy.eval()
    try:
        with torch.no_grad():
            mine = [token_logprobs(policy, batch, temps) for batch, temps in pieces]
            with _reference(policy, reference_adapter):
                theirs = [token_logprobs(policy, batch, temps) for batch, temps in pieces]
    finally:
        policy.train(was_training)
    total = count = 0.0
    for (batch, _), own, ref in zip(pieces, mine, theirs):
        log_ratio = own - ref
        mask = batch.response_mask.float()
        total += float(((torch.exp(log_ratio) - 1.0 - log_ratio) * mask).sum())
        count += float(mask.sum())
    return total / count if count else 0.0


@contextmanager
def _reference(policy: Any, adapter: str | Path | None) -> Iterator[None]:
    """The serving side active for the block: ``adapter`` loaded beside the policy's own and
    active (removed afterwards), or no adapter at all (the base serves)."""
    if adapter is None:
        with policy.disable_adapter():
            yield
        return
    own = policy.active_adapter
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    policy.load_adapter(str(adapter), adapter_name=REFERENCE_ADAPTER, is_trainable=False)
    try:
        policy.set_adapter(REFERENCE_ADAPTER)
        yield
    finally:
        policy.set_adapter(own)
        policy.delete_adapter(REFERENCE_ADAPTER)
        for name, param in policy.named_parameters():  # set_adapter may have changed what trains
            param.requires_grad_(name in trainable)
