"""Next-token sampling shared by the serving engine and training rollouts.

Logprob convention (what ``call.extras["logprobs"]`` holds): the log-probability of the
sampled token under the temperature-scaled distribution ``log_softmax(logits / T)``, taken
*before* top-p, top-k and min-p truncation (they only narrow which tokens may be drawn). For greedy
decoding (``temperature == 0``) it is taken at ``T = 1``, i.e. ``log_softmax(logits)``.
Both this module and ``reef_train.token_logprobs(..., temperature=T)``, which recomputes it,
take it from ``reef_train.logprobs.scaled_log_softmax``, so importance ratios between the
recorded policy and the current one start at 1.
``top_logprobs_rows`` gives the K most likely tokens of a row in the same convention (what
``call.extras["top_logprobs"]`` holds when a recipe asks for them).
"""

from __future__ import annotations

import secrets

import torch

from .logprobs import scaled_log_softmax


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator private to one request, so its draws never depend on its batch-mates.

    Any integer seeds it: torch takes 64 bits (a negative seed as its two's complement), so a
    seed is taken modulo 2**64, which leaves every seed torch accepts as it was."""
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed) % 2**64 if seed is not None else secrets.randbits(63))
    return g


def sample_rows(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ps: list[float],
    generators: list[torch.Generator],
    top_ks: list[int] | None = None,
    min_ps: list[float] | None = None,
) -> tuple[list[int], list[float]]:
    """Pick one token per row of ``logits`` ``[B, V]``; return ``(tokens, logprobs)``.

    ``top_ks`` (0: off) and ``min_ps`` (0: off) narrow the draw as SGLang and vLLM do: every
    filter is taken on the row's temperature-scaled distribution, and what survives all of them
    is renormalised (the most likely token always survives)."""
    logp = scaled_log_softmax(logits, torch.tensor(temperatures, dtype=torch.float32, device=logits.device))
    greedy = logp.argmax(dim=-1).tolist()
    top_ks = top_ks or [0] * len(temperatures)
    min_ps = min_ps or [0.0] * len(temperatures)
    tokens: list[int] = []
    for i, (t, p, g, k, m) in enumerate(zip(temperatures, top_ps, generators, top_ks, min_ps)):
        if t <= 0:
            tokens.append(int(greedy[i]))
            continue
        probs = logp[i].exp().cpu()
        if p < 1.0 or k > 0 or m > 0:
            probs = _truncate(probs, p, k, m)
        tokens.append(int(torch.multinomial(probs, 1, generator=g).item()))
    index = torch.tensor(tokens, device=logp.device)[:, None]
    chosen = logp.gather(1, index).squeeze(1).tolist()
    return tokens, [float(x) for x in chosen]


def top_logprobs_rows(logits: torch.Tensor, temperatures: list[float], ks: list[int]) -> list[list[list[float]] | None]:
    """For each row of ``logits`` ``[B, V]`` with ``k > 0``: its ``k`` most likely tokens as
    ``[token_id, logprob]`` pairs, most likely first, with the sampling convention
    (``log_softmax(logits / T)``, ``T <= 0`` taken as 1); None for rows with ``k == 0``.
    Only the rows that ask are computed."""
    out: list[list[list[float]] | None] = [None] * len(ks)
    rows = [i for i, k in enumerate(ks) if k > 0]
    if not rows:
        return out
    index = torch.tensor(rows, device=logits.device)
    temps = torch.tensor([temperatures[i] for i in rows], dtype=torch.float32, device=logits.device)
    logp = scaled_log_softmax(logits.index_select(0, index), temps)
    k_max = min(max(ks[i] for i in rows), logp.shape[-1])
    values, ids = logp.topk(k_max, dim=-1)
    values, ids = values.tolist(), ids.tolist()
    for j, i in enumerate(rows):
        k = min(ks[i], k_max)
        out[i] = [[int(t), float(v)] for t, v in zip(ids[j][:k], values[j][:k])]
    return out


def _truncate(probs: torch.Tensor, top_p: float, top_k: int, min_p: float) -> torch.Tensor:
    """Zero every token outside the smallest set whose probability mass reaches ``top_p``, past
    the ``top_k`` most likely (0: no limit), or less likely than ``min_p`` times the most likely
    token; renormalise what is left."""
    sorted_probs, order = probs.sort(descending=True)
    cumulative = sorted_probs.cumsum(0)
    keep = (cumulative - sorted_probs) < top_p
    if top_k > 0:
        keep[top_k:] = False
    if min_p > 0:
        keep &= sorted_probs >= sorted_probs[0] * min_p
    keep[0] = True
    filtered = torch.zeros_like(probs)
    filtered[order[keep]] = sorted_probs[keep]
    return filtered / filtered.sum()
