"""What a discovery task is: an instruction, how its output is verified, and what it rewards.

A task never trusts the solution's claims: ``verify`` recomputes the objective from the output
itself (the circles' coordinates, the numbers) and says why an output is invalid. Answer tasks
are verified on the model's text; program tasks on what the program printed inside the judge's
sandbox (``reef_recipe_tttd.judge``).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

Kind = Literal["answer", "program"]

_FENCE = re.compile(r"```(?:[a-zA-Z0-9_+-]*)\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Verdict:
    """The judge's word on one solution.

    ``score`` is the training reward (non-negative), ``raw`` the metric that ranks the archive
    (Guidance-TTT's ``scoreUnbounded``), ``valid`` whether the output passed every check, and
    ``message`` what the next prompt quotes (why it failed, or what it achieved)."""

    score: float
    raw: float
    valid: bool
    message: str = ""


def invalid(message: str, reward: float = 0.0) -> Verdict:
    return Verdict(score=reward, raw=reward, valid=False, message=message)


class Task(ABC):
    """One problem to discover a better solution for."""

    #: the registry name
    name: str = "task"
    #: ``answer``: the model writes the output itself; ``program``: a Python program that prints it
    kind: Kind = "answer"
    #: the reward of an invalid output
    invalid_reward: float = 0.0
    #: a good ``max_tokens`` for one attempt
    max_tokens: int = 64

    @property
    @abstractmethod
    def instruction(self) -> str:
        """The problem statement every prompt starts with (it fixes the output format)."""

    @abstractmethod
    def verify(self, output: str) -> Verdict:
        """Recompute the objective from ``output`` (an answer, or a program's stdout)."""

    def seeds(self) -> list[str]:
        """Starting solutions the archive is seeded with (judged, kept forever); none by default:
        the first prompts then simply ask for a solution."""
        return []

    def extract(self, text: str) -> str:
        """The solution inside a model's reply: the last fenced block when there is one."""
        blocks = _FENCE.findall(text or "")
        return blocks[-1].strip() if blocks else (text or "").strip()

    def identity(self) -> dict:
        """What makes two runs of this task the same problem (archives refuse to mix)."""
        return {"name": self.name, "kind": self.kind, "instruction": self.instruction,
                "invalid_reward": self.invalid_reward, "seeds": self.seeds()}
