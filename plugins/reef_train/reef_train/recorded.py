"""Checks of recorded token data before a recipe trains on it (no torch): a record's token ids
and sampling logprobs come from whatever runtime served it, maybe another model than the one
training loads (the scenario's model changed since), so a recipe skips, with a reason, what the
learner would misread or fail on, instead of failing the whole step on one item."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def recorded_tokens_problem(prompt: Sequence[Any] | None, response: Sequence[Any] | None,
                            logprobs: Sequence[Any] | None, vocab_size: int | None = None) -> str | None:
    """Why a record's tokens cannot be trained on, or None: ``no_tokens`` (missing, or not one
    logprob per response token), ``bad_tokens`` (an id that is not an integer in
    ``[0, vocab_size)``, a logprob that is not a finite number of at most 0)."""
    if not prompt or not response or logprobs is None or len(logprobs) != len(response):
        return "no_tokens"
    limit = vocab_size if vocab_size and vocab_size > 0 else None
    for t in (*prompt, *response):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0 or (limit is not None and t >= limit):
            return "bad_tokens"
    for x in logprobs:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x > 1e-3:
            return "bad_tokens"
    return None


def vocab_size_of(model_dir: str | Path | None) -> int | None:
    """The vocabulary size in ``model_dir``'s ``config.json`` (or its ``text_config``), or None."""
    if model_dir is None:
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for c in (config, config.get("text_config") if isinstance(config, dict) else None):
        n = c.get("vocab_size") if isinstance(c, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None
