"""What the demo's simulated users ask: short everyday questions, one distinct question per use.

Held-out questions (asked before and after learning, never reported on), the gate's questions
and the users' traffic are disjoint slices of one seeded shuffle, so the score the demo reports
is measured on questions the recipe never learnt from.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

QUESTIONS: tuple[str, ...] = (
    "What is the capital of France?", "Name a fruit that is yellow.", "Why is the sky blue?",
    "What do bees make?", "How many legs does a spider have?", "What language is spoken in Brazil?",
    "What is a synonym for happy?", "Who wrote Romeo and Juliet?", "What is the largest ocean on Earth?",
    "How many days are in a week?", "What gas do plants take in?", "What is the opposite of cold?",
    "What colour is a ripe banana?", "Which planet is known as the red planet?", "What is ice made of?",
    "How many continents are there?", "What animal says moo?", "What do you call a baby dog?",
    "What is the tallest animal?", "What is the main ingredient of bread?", "Where do penguins live?",
    "What is the freezing point of water?", "What instrument has black and white keys?",
    "What do caterpillars turn into?", "How many hours are in a day?", "What is the capital of Japan?",
    "Which season comes after winter?", "What is the fastest land animal?", "What do we use to see?",
    "What is the chemical symbol for water?", "Name a primary colour.", "What shape has three sides?",
    "What is the largest planet in our solar system?", "What do fish breathe with?",
    "How many minutes are in an hour?", "What is the capital of Italy?", "What is a group of wolves called?",
    "Which bird cannot fly but runs fast?", "What is the hottest planet?", "What do cows drink?",
    "What is the longest river in Africa?", "How many sides does a square have?",
    "What is the capital of Spain?", "What is the opposite of up?", "Name a vegetable that is orange.",
    "What does a thermometer measure?", "What is the plural of mouse?", "Which month has the fewest days?",
    "What is the capital of Germany?", "What do plants need to grow?", "What is frozen rain called?",
    "What metal is liquid at room temperature?", "What is the smallest prime number?",
    "What is the capital of Canada?", "What do spiders spin?", "Which animal has a trunk?",
    "What is the centre of an atom called?", "How many strings does a violin have?",
    "What is the capital of Egypt?", "What is a baby cat called?", "Which organ pumps blood?",
    "What do you call frozen water?", "What is the capital of Australia?", "How many wheels does a bicycle have?",
    "What is the boiling point of water?", "What colour is the sun?", "Which animal is known for its stripes?",
    "What is the capital of Russia?", "What do you call a house made of ice?", "What is the opposite of day?",
    "Name a musical instrument with strings.", "What is the capital of China?",
)


@dataclass(frozen=True)
class Questions:
    heldout: list[str]
    gate: list[str]
    traffic: list[str]


def deal(*, heldout: int, gate: int, traffic: int, seed: int = 0) -> Questions:
    """Disjoint held-out, gate and traffic questions from one seeded shuffle; the traffic goes
    round the questions left again when it needs more of them."""
    if heldout + gate >= len(QUESTIONS):
        raise ValueError(f"{heldout} held-out and {gate} gate questions leave none of {len(QUESTIONS)} for traffic")
    pool = list(QUESTIONS)
    random.Random(seed).shuffle(pool)
    rest = pool[heldout + gate:]
    return Questions(heldout=pool[:heldout], gate=pool[heldout:heldout + gate],
                     traffic=[rest[i % len(rest)] for i in range(traffic)])
