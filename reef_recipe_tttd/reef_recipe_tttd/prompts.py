"""The prompts of the search: the task instruction, then the parent's solution, its reward and
the tail of its judge output, and a request to improve it (or simply to solve the task when the
parent is a seed without a solution). Guidance-TTT's guide sees the parent's summary instead of
its code."""

from __future__ import annotations

from .archive import Node
from .tasks import Task

#: characters of the parent's judge output a prompt quotes
OUTPUT_TAIL = 500


def solve_prompt(task: Task, parent: Node | None) -> list[dict[str, str]]:
    """Chat messages asking for one attempt at ``task`` from ``parent``."""
    what = "program" if task.kind == "program" else "answer"
    if parent is None or parent.solution is None:
        text = f"{task.instruction}\n\nWrite your {what}. Reply with the {what} only."
    else:
        tail = (parent.output or "")[-OUTPUT_TAIL:]
        text = (f"{task.instruction}\n\nA previous {what}:\n{parent.solution}\n\n"
                f"Its reward: {parent.value:.4f}\nJudge output (last {OUTPUT_TAIL} characters):\n{tail}\n\n"
                f"Improve it: write a better {what}. Reply with the {what} only.")
    return [{"role": "user", "content": text}]


def guide_prompt(task: Task, parent: Node | None) -> list[dict[str, str]]:
    """Guidance-TTT: the guide reads the problem, the parent's canonical summary (not its code)
    and its score, and must end with exactly one non-empty ``<guidance>`` block."""
    if parent is None or parent.solution is None:
        state = "There is no solution yet."
    else:
        state = f"Current solution summary:\n{parent.summary or parent.output[-OUTPUT_TAIL:]}\nIts score: {parent.value:.4f}"
    text = (f"{task.instruction}\n\n{state}\n\nAn executor will rewrite the solution following your advice. "
            "End your reply with exactly one <guidance>...</guidance> block saying what to change.")
    return [{"role": "user", "content": text}]
