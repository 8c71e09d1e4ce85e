"""Sample completions from a training copy, with sampling logprobs in the runtime's convention."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .data import Sample
from .sampling import make_generator, sample_rows


def rollout(
    model: Any,
    prompts: Sequence[list[int]],
    *,
    pad_id: int,
    eos_ids: Iterable[int],
    num_samples: int = 1,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int | None = None,
) -> list[Sample]:
    """Sample ``num_samples`` completions per prompt from ``model`` (a training copy), with
    their sampling logprobs in the runtime's convention. Samples come out grouped by prompt."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    eos = set(eos_ids)
    rows = [list(p) for p in prompts for _ in range(num_samples)]
    gens = [make_generator(None if seed is None else seed + i) for i in range(len(rows))]
    width = max(len(p) for p in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(rows):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    was_training = model.training
    model.eval()
    out_ids: list[list[int]] = [[] for _ in rows]
    out_lp: list[list[float]] = [[] for _ in rows]
    done = [False] * len(rows)
    try:
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            step_ids, step_pos, attn = ids, positions, mask
            for _ in range(max_new_tokens):
                logits = model(
                    input_ids=step_ids.to(device), attention_mask=attn.to(device), position_ids=step_pos.to(device),
                    use_cache=True, logits_to_keep=1, **{_cache_kw(model): cache},
                ).logits[:, -1, :]
                toks, lps = sample_rows(logits, [temperature] * len(rows), [top_p] * len(rows), gens)
                for i, (t, lp) in enumerate(zip(toks, lps)):
                    if not done[i]:
                        out_ids[i].append(t)
                        out_lp[i].append(lp)
                        done[i] = t in eos
                if all(done):
                    break
                step_ids = torch.tensor(toks)[:, None]
                step_pos = step_pos[:, -1:] + 1
                attn = torch.cat([attn, torch.ones((len(rows), 1), dtype=torch.long)], 1)
    finally:
        model.train(was_training)
    return [Sample(prompt_ids=p, response_ids=r, logprobs=lp) for p, r, lp in zip(rows, out_ids, out_lp)]


def _cache_kw(model: Any) -> str:
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"
