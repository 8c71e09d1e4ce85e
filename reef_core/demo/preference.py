"""The simulated users' hidden preference: short answers, graded by counting words.

Chosen by measuring what SmolLM2-135M-Instruct visibly follows once a rule is in its system
prompt (docs/demo.md): asked to start every answer with a fixed phrase ("Ahoy!", "Certainly!",
"Answer: ..."), with or without an example, it never did (0 of 8 questions each); told to answer
in one short sentence, its answers do get shorter. The grader is deterministic and the gate
applies the very same test as a regex, so the users and the gate agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Preference:
    """What the users want, what they write back when an answer misses it, and the test."""

    description: str
    #: the feedback text of a report on an answer that misses the preference
    feedback: str
    #: the test as a regex (``re.search`` with DOTALL: the gate's ``regex`` grader)
    pattern: str
    #: answers are cut here; long enough that an answer missing the preference shows it
    max_tokens: int
    examples_met: tuple[str, ...] = ()
    examples_missed: tuple[str, ...] = ()

    def grade(self, answer: str | None) -> float:
        return 1.0 if re.search(self.pattern, answer or "", re.S) else 0.0


MAX_WORDS = 25

PREFERENCE = Preference(
    description=f"short answers (at most {MAX_WORDS} words)",
    feedback="Keep answers to one short sentence.",
    # 1 to MAX_WORDS words, the whole answer (a word: a run of non-space characters)
    pattern=rf"\A\s*\S+(?:\s+\S+){{0,{MAX_WORDS - 1}}}\s*\Z",
    max_tokens=48,
    examples_met=("The capital of France is Paris.", "A spider has 8 legs.", " Paris. "),
    examples_missed=("", "   ", " ".join(["word"] * (MAX_WORDS + 1)),
                     "The sky is blue because of a process called Rayleigh scattering, which occurs when light "
                     "encounters tiny molecules of gases in the atmosphere and is scattered in every direction"),
)
