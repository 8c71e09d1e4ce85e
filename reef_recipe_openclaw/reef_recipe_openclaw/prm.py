"""The judge's two questions about a turn, and how its answers become a reward and hints.

*Evaluative*: did the next state show the reply worked? ``m`` independent votes, each
classifying the next state as progress (+1), a correction, redo, rephrase or error (−1), or
ambiguous (0), read from the last ``\\boxed{}`` of the answer. The plurality wins; a tied
plurality, or no valid vote, is 0. A failed or timed-out call is a failed vote.

*Hindsight hint*: does the next state say what the reply should have done? ``m`` votes, each
±1 and, on +1, a short actionable hint between ``[HINT_START]`` and ``[HINT_END]``. The
candidates are the accepted hints longer than 10 characters, de-duplicated, shortest first,
at most ``max_candidates``.

``judge_turn`` asks both questions of a ``Judge`` (``reef_recipe_openclaw.judge``) with
``concurrency``-free fan-out: the caller bounds how many turns are judged at once.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .sessions import BoundTurn

HINT_START, HINT_END = "[HINT_START]", "[HINT_END]"
MIN_HINT_CHARS = 10
#: a hint becomes part of a teacher prompt: a report's feedback of megabytes would be tokenized and
#: run forward whole (and copied into the recipe's record), so a hint is cut at this length
MAX_HINT_CHARS = 4000

EVALUATE_SYSTEM = (
    "You judge an AI assistant's reply by what happened right after it. You see the conversation "
    "so far, the assistant's reply, and the next message: the user's next words or a tool's result.\n"
    "Classify what the next message says about the reply:\n"
    "  +1  progress: the user moves on, accepts, thanks, or the tool call worked;\n"
    "  -1  the reply failed: the user corrects it, asks for a redo or says it differently, complains, "
    "or the tool reports an error;\n"
    "   0  ambiguous: the next message says nothing either way.\n"
    "Think briefly, then give your verdict as \\boxed{1}, \\boxed{-1} or \\boxed{0} at the end."
)

HINT_SYSTEM = (
    "You read an AI assistant's reply and what happened right after it (the user's next message or a "
    "tool's result). Decide whether that next message reveals something the assistant should have done "
    "differently in this reply (a preference, a correction, a missing step).\n"
    "If it does, answer \\boxed{1} and then write a hint of one to three sentences that would have led "
    f"the assistant to a better reply, between {HINT_START} and {HINT_END}. Write the hint as an "
    "instruction to the assistant; do not quote the next message.\n"
    "If it does not, answer \\boxed{-1} and no hint."
)

_BOXED = re.compile(r"\\boxed\{\s*([^{}]*?)\s*\}")


@dataclass
class JudgeResult:
    """Everything the judge said about one turn (what the candidate's metadata shows)."""

    eval_votes: list[int | None] = field(default_factory=list)
    eval_score: int = 0
    hint_votes: list[int | None] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    failed_calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"eval_votes": self.eval_votes, "eval_score": self.eval_score, "hint_votes": self.hint_votes,
                "hints": self.hints, "failed_calls": self.failed_calls}


def parse_boxed(text: str | None) -> int | None:
    """The vote in the last ``\\boxed{}`` of ``text``: 1, -1 or 0; None when there is none or it
    holds something else."""
    if not text:
        return None
    found = _BOXED.findall(text)
    if not found:
        return None
    value = found[-1].replace(" ", "")
    return {"1": 1, "+1": 1, "-1": -1, "0": 0, "+0": 0, "-0": 0}.get(value)


def aggregate_votes(votes: Sequence[int | None]) -> int:
    """Plurality of the valid votes; a tie at the top, or no valid vote, is 0."""
    counts = Counter(v for v in votes if v in (-1, 0, 1))
    if not counts:
        return 0
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return 0
    return ranked[0][0]


def parse_hint(text: str | None) -> tuple[int | None, str | None]:
    """(vote, hint) of one hint answer; the hint only on a +1 vote with both markers."""
    vote = parse_boxed(text)
    if vote != 1 or not text:
        return vote, None
    start = text.rfind(HINT_START)
    if start < 0:
        return vote, None
    end = text.find(HINT_END, start + len(HINT_START))
    if end < 0:
        return vote, None
    hint = " ".join(text[start + len(HINT_START):end].split())
    return vote, hint or None


def hint_candidates(answers: Sequence[tuple[int | None, str | None]], max_candidates: int) -> list[str]:
    """Accepted hints longer than ``MIN_HINT_CHARS``, de-duplicated, shortest first, capped."""
    seen: set[str] = set()
    out: list[str] = []
    for vote, hint in answers:
        if vote != 1 or not hint or len(hint) <= MIN_HINT_CHARS:
            continue
        key = hint.casefold()
        if key in seen:
            continue
        seen.add(key)
        out.append(hint)
    out.sort(key=len)  # stable: equal lengths keep their vote order
    return out[:max(int(max_candidates), 0)]


# ---------------------------------------------------------------------- prompts


def conversation_text(bound: BoundTurn, max_chars: int = 6000) -> str:
    """The turn as the judge reads it: the conversation, the reply, the next state."""
    lines = []
    for role, text, calls in bound.turn.messages:
        shown = text + "".join(f"\n[calls {name}({args})]" for name, args in calls)
        lines.append(f"[{role}] {shown}")
    history = "\n".join(lines)
    if len(history) > max_chars:
        history = "…" + history[-max_chars:]
    _, reply, calls = bound.turn.reply
    reply_shown = reply + "".join(f"\n[calls {name}({args})]" for name, args in calls)
    nxt = bound.next_state
    return (f"Conversation so far:\n{history}\n\n"
            f"The assistant's reply:\n{reply_shown}\n\n"
            f"What came next ({'a tool result' if nxt.role == 'tool' else 'the ' + nxt.role + ' message'}):\n"
            f"{nxt.text}")


def evaluate_messages(bound: BoundTurn) -> list[dict[str, str]]:
    return [{"role": "system", "content": EVALUATE_SYSTEM}, {"role": "user", "content": conversation_text(bound)}]


def hint_messages(bound: BoundTurn) -> list[dict[str, str]]:
    return [{"role": "system", "content": HINT_SYSTEM}, {"role": "user", "content": conversation_text(bound)}]


# ---------------------------------------------------------------------- asking


async def _vote(judge: Any, messages: list[dict[str, str]], temperature: float, max_tokens: int,
                timeout_s: float) -> str | None:
    try:
        return await asyncio.wait_for(judge.generate(messages, temperature=temperature, max_tokens=max_tokens),
                                      timeout=timeout_s)
    except asyncio.CancelledError:
        raise
    except Exception:  # a failed or timed-out call is a failed vote
        return None


async def judge_turn(judge: Any, bound: BoundTurn, *, m: int, temperature: float, max_tokens: int,
                     timeout_s: float, max_hint_candidates: int) -> JudgeResult:
    """Ask ``judge`` both questions ``m`` times each (all calls at once) and aggregate."""
    eval_msgs, hint_msgs = evaluate_messages(bound), hint_messages(bound)
    calls = [_vote(judge, eval_msgs, temperature, max_tokens, timeout_s) for _ in range(m)]
    calls += [_vote(judge, hint_msgs, temperature, max_tokens, timeout_s) for _ in range(m)]
    answers = await asyncio.gather(*calls)
    evals, hints = answers[:m], answers[m:]
    parsed_hints = [parse_hint(a) for a in hints]
    eval_votes = [parse_boxed(a) for a in evals]
    return JudgeResult(eval_votes=eval_votes, eval_score=aggregate_votes(eval_votes),
                       hint_votes=[v for v, _ in parsed_hints],
                       hints=hint_candidates(parsed_hints, max_hint_candidates),
                       failed_calls=sum(a is None for a in answers))
