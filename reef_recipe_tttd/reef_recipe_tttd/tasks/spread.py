"""Numeric spread: write n numbers in [0, 1] as far apart from each other as possible.

The reward is the smallest gap between two of the numbers (sorted) times n − 1, so an evenly
spaced answer that includes both ends (0, 0.25, 0.5, 0.75, 1 for n = 5) scores 1. The answer is
the first line of exactly n numbers and nothing else but separators (spaces, commas, semicolons,
a final full stop); prose lines around it are ignored, and a line of prose is never the answer,
though it holds n numbers: "three numbers between 0 and 1 with a gap of 0.5" would otherwise
score the best possible. Invalid: no such line, a number outside [0, 1], or a repeated number.
"""

from __future__ import annotations

import math
import re

from .base import Task, Verdict, invalid

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
#: what an answer line may hold besides its numbers
_SEPARATORS = " \t,;."


def numbers_only(line: str) -> list[float] | None:
    """The numbers of ``line`` when it holds nothing else but separators, else None (prose)."""
    if _NUMBER.sub(" ", line).strip(_SEPARATORS):
        return None
    return [float(x) for x in _NUMBER.findall(line)]


class NumericSpread(Task):
    max_tokens = 40

    def __init__(self, n: int = 5):
        if n < 2:
            raise ValueError("spread: n must be 2 or more")
        self.n = int(n)
        self.name = f"spread{self.n}"

    @property
    def instruction(self) -> str:
        return (f"Write {self.n} different numbers between 0 and 1, separated by spaces, so that the smallest "
                f"distance between any two of them is as large as possible.")

    def verify(self, output: str) -> Verdict:
        lines = [numbers_only(line) for line in (output or "").splitlines()]
        nums = next((row for row in lines if row is not None and len(row) == self.n), None)
        if nums is None:
            return invalid(f"no line holds exactly {self.n} numbers and nothing else", self.invalid_reward)
        if not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in nums):
            return invalid("a number is outside [0, 1]", self.invalid_reward)
        ordered = sorted(nums)
        gap = min(b - a for a, b in zip(ordered, ordered[1:]))
        if gap <= 0:
            return invalid("a number repeats", self.invalid_reward)
        value = gap * (self.n - 1)
        return Verdict(score=value, raw=value, valid=True, message=f"valid; smallest gap {gap:.4f}, score {value:.4f}")

    def seeds(self) -> list[str]:
        """A valid but poor start: numbers bunched in the middle."""
        return [" ".join(f"{0.4 + 0.05 * i:.2f}" for i in range(self.n))]

    def identity(self) -> dict:
        return {**super().identity(), "n": self.n}
