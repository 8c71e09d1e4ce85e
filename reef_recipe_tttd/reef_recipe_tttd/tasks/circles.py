"""Packing k circles in the unit square: maximise the sum of their radii.

The output is k lines ``x y r`` (centre and radius); other lines (prose) are ignored. The
verifier checks the count, that every
number is finite and every radius positive, that each circle lies inside [0, 1]², and that no
two overlap; then the reward is the sum of the radii. For k = 3 the best known sum is about
0.7645 (no shipped prompt says so).
"""

from __future__ import annotations

import math
import re

from .base import Kind, Task, Verdict, invalid

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
TOLERANCE = 1e-9


class CirclePacking(Task):
    max_tokens = 48

    def __init__(self, k: int = 3, kind: Kind = "answer"):
        if k < 1:
            raise ValueError("circles: k must be 1 or more")
        self.k = int(k)
        self.kind = kind
        self.name = f"circles{self.k}" + ("-program" if kind == "program" else "")
        if kind == "program":
            self.max_tokens = 400

    @property
    def instruction(self) -> str:
        what = (f"Write a Python program that prints {self.k} lines" if self.kind == "program"
                else f"Answer with exactly {self.k} lines")
        return (f"Pack {self.k} circles inside the unit square [0,1]x[0,1] without overlap so that the sum of "
                f"their radii is as large as possible. {what}, one circle per line: x y r "
                f"(the centre and the radius, decimal numbers).")

    def parse(self, output: str) -> list[tuple[float, float, float]] | str:
        circles = []
        for line in (output or "").strip().splitlines():
            nums = _NUMBER.findall(line)
            if len(nums) == 3:
                circles.append(tuple(float(x) for x in nums))
        if len(circles) != self.k:
            return f"{len(circles)} lines of three numbers (x y r), not {self.k}"
        return circles

    def verify(self, output: str) -> Verdict:
        circles = self.parse(output)
        if isinstance(circles, str):
            return invalid(circles, self.invalid_reward)
        for i, (x, y, r) in enumerate(circles, 1):
            if not all(math.isfinite(v) for v in (x, y, r)):
                return invalid(f"circle {i} has a number that is not finite", self.invalid_reward)
            if r <= 0:
                return invalid(f"circle {i} has radius {r:g}, not above 0", self.invalid_reward)
            if x - r < -TOLERANCE or x + r > 1 + TOLERANCE or y - r < -TOLERANCE or y + r > 1 + TOLERANCE:
                return invalid(f"circle {i} ({x:g} {y:g} {r:g}) leaves the square", self.invalid_reward)
        for i in range(self.k):
            for j in range(i + 1, self.k):
                (xi, yi, ri), (xj, yj, rj) = circles[i], circles[j]
                if math.hypot(xi - xj, yi - yj) < ri + rj - TOLERANCE:
                    return invalid(f"circles {i + 1} and {j + 1} overlap", self.invalid_reward)
        total = sum(r for _, _, r in circles)
        return Verdict(score=total, raw=total, valid=True, message=f"valid; sum of radii {total:.4f}")

    def seeds(self) -> list[str]:
        """A valid but poor start: small circles on the diagonal."""
        if self.kind == "program":
            return []
        return ["\n".join(f"{(i + 0.5) / self.k:.2f} {(i + 0.5) / self.k:.2f} {0.2 / self.k:.2f}" for i in range(self.k))]

    def identity(self) -> dict:
        return {**super().identity(), "k": self.k}
