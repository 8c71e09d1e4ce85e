"""Guidance-TTT: a trainable guide writes advice, a frozen executor writes the solution.

Per rollout: the guide (the policy served by Reef, the only model that trains) reads the
problem, the parent's canonical summary and its score, and must end its reply with exactly one
non-empty ``<guidance>`` block. Malformed guidance scores the task's invalid reward without
calling the executor (and is not resampled; it still counts as a visit of the parent). The
executor — any OpenAI-compatible endpoint (``OpenAIExecutor``) or a Python callable — reads the
parent's solution and the guidance and returns a full ``<solution>`` and a replacement
``<summary>``; it never goes through Reef, so only guide tokens are ever recorded and trained.
The judge's ``score`` is the training reward and ``raw`` ranks the archive; invalid solutions
never enter the archive. An executor error, a reply without a solution, a judge error or a
non-finite score stops the step (``StepAborted``): none becomes a synthetic zero.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .archive import Node
from .harness import Outcome, StepAborted
from .judge import Judge
from .prompts import guide_prompt
from .tasks import Task

_GUIDANCE = re.compile(r"<guidance>(.*?)</guidance>", re.DOTALL | re.IGNORECASE)
_SOLUTION = re.compile(r"<solution>(.*?)</solution>", re.DOTALL | re.IGNORECASE)
_SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.DOTALL | re.IGNORECASE)


def parse_guidance(reply: str) -> str | None:
    """The guidance of a guide's reply: exactly one non-empty ``<guidance>`` block, with nothing
    but whitespace after it; None when malformed."""
    blocks = list(_GUIDANCE.finditer(reply or ""))
    if len(blocks) != 1:
        return None
    block = blocks[0]
    text = block.group(1).strip()
    if not text or (reply[block.end():].strip()):
        return None
    return text


@dataclass(frozen=True)
class ExecutorReply:
    solution: str
    summary: str


class ExecutorError(RuntimeError):
    """The executor failed or answered without a solution."""


def parse_executor_reply(text: str) -> ExecutorReply:
    solutions = _SOLUTION.findall(text or "")
    if not solutions or not solutions[-1].strip():
        raise ExecutorError("the executor's reply has no <solution> block")
    summaries = _SUMMARY.findall(text or "")
    return ExecutorReply(solutions[-1].strip(), summaries[-1].strip() if summaries else "")


#: an executor: (task, parent solution or None, guidance) -> the reply text with <solution> and <summary>
Executor = Callable[[Task, "str | None", str], str]


class OpenAIExecutor:
    """A frozen executor at any OpenAI-compatible endpoint (a local vLLM/SGLang, OpenRouter …)."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, temperature: float = 0.7,
                 max_tokens: int = 8192, timeout: float = 600.0):
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url, api_key=api_key or "unused", timeout=timeout, max_retries=2)
        self.model, self.temperature, self.max_tokens = model, temperature, max_tokens

    def __call__(self, task: Task, parent: str | None, guidance: str) -> str:
        code = parent if parent is not None else "(none yet)"
        prompt = (f"{task.instruction}\n\nCurrent solution:\n{code}\n\nAdvice to follow:\n{guidance}\n\n"
                  "Write the complete new solution inside <solution>...</solution>, then a short canonical "
                  "description of it inside <summary>...</summary>.")
        reply = self.client.chat.completions.create(model=self.model, temperature=self.temperature,
                                                    max_tokens=self.max_tokens,
                                                    messages=[{"role": "user", "content": prompt}])
        return reply.choices[0].message.content or ""


class GuidanceAttempt:
    """One Guidance-TTT rollout: the guide's reply is what Reef samples, records and trains."""

    mode = "guidance"

    def __init__(self, task: Task, executor: Executor, judge: Judge | Callable[[str], Any] | None = None):
        self.task = task
        self.executor = executor
        self.judge_fn = judge or Judge(task)
        #: executor calls made (a test and metrics aid)
        self.executor_calls = 0

    def prompt(self, parent: Node) -> list[dict[str, str]]:
        return guide_prompt(self.task, parent)

    def judge(self, parent: Node, reply: str) -> Outcome:
        guidance = parse_guidance(reply)
        if guidance is None:
            r = self.task.invalid_reward
            return Outcome(score=r, raw=r, valid=False, solution=None, output="malformed guidance")
        self.executor_calls += 1
        try:
            answer = parse_executor_reply(self.executor(self.task, parent.solution, guidance))
        except Exception as exc:
            raise StepAborted(f"the executor failed ({type(exc).__name__}: {exc}); the step stops") from exc
        try:
            verdict = self.judge_fn(answer.solution)
        except Exception as exc:
            raise StepAborted(f"the judge failed ({type(exc).__name__}: {exc}); the step stops") from exc
        score, raw = getattr(verdict, "score", None), getattr(verdict, "raw", None)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (score, raw)):
            raise StepAborted(f"the judge returned a malformed score ({score!r}, raw {raw!r}); the step stops")
        return Outcome(score=max(float(score), 0.0), raw=float(raw), valid=bool(verdict.valid),
                       solution=answer.solution if verdict.valid else None, output=verdict.message,
                       summary=answer.summary)


# ---------------------------------------------------------------------- Python executors

EXECUTORS: dict[str, Executor] = {}


def register_executor(name: str, executor: Executor) -> Executor:
    """Make ``executor`` available as ``--executor NAME``."""
    EXECUTORS[name] = executor
    return executor


def load_executor(spec: str) -> Executor:
    """A registered executor by name, or ``module:attr`` (a callable, or a class called with no arguments)."""
    if spec in EXECUTORS:
        return EXECUTORS[spec]
    if ":" in spec:
        module, _, attr = spec.partition(":")
        obj = getattr(importlib.import_module(module), attr)
        return obj() if isinstance(obj, type) else obj
    raise ValueError(f"no executor named {spec!r}: use one of {sorted(EXECUTORS)} or module:attr")


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)")


def keyword_executor(task: Task, parent: str | None, guidance: str) -> str:
    """The shipped toy executor: deterministic edits of the parent's numbers chosen by keywords
    in the guidance (``grow``/``larger``, ``shrink``/``smaller``, ``spread``/``apart``,
    ``center``, ``even``/``uniform``). Words it does not know change nothing. For circle packing
    and numeric spread; it shows the plumbing and that a guide can learn which advice pays, not
    what a real code-writing executor can do."""
    words = guidance.lower()
    k = getattr(task, "k", None)
    if k is not None:
        circles = _circles(parent, k)
        for word in re.findall(r"[a-z]+", words):
            if word in ("grow", "larger", "bigger"):
                circles = [(x, y, r * 1.1) for x, y, r in circles]
            elif word in ("shrink", "smaller"):
                circles = [(x, y, r * 0.9) for x, y, r in circles]
            elif word in ("spread", "apart"):
                circles = [(0.5 + (x - 0.5) * 1.1, 0.5 + (y - 0.5) * 1.1, r) for x, y, r in circles]
            elif word in ("center", "centre"):
                circles = [(0.5 + (x - 0.5) * 0.9, 0.5 + (y - 0.5) * 0.9, r) for x, y, r in circles]
        text = "\n".join(f"{x:.4f} {y:.4f} {r:.4f}" for x, y, r in circles)
        return f"<solution>{text}</solution><summary>{k} circles, radii sum {sum(c[2] for c in circles):.4f}</summary>"
    n = getattr(task, "n", 5)
    nums = [float(v) for v in _NUMBER.findall(parent or "")][:n]
    if len(nums) != n:
        nums = [0.4 + 0.05 * i for i in range(n)]
    for word in re.findall(r"[a-z]+", words):
        if word in ("spread", "apart", "wider"):
            nums = [min(max(0.5 + (v - 0.5) * 1.25, 0.0), 1.0) for v in nums]
        elif word in ("even", "uniform"):
            ordered = sorted(nums)
            lo, hi = ordered[0], ordered[-1]
            target = [lo + (hi - lo) * i / (n - 1) for i in range(n)]
            nums = [(a + b) / 2 for a, b in zip(ordered, target)]
    text = " ".join(f"{v:.4f}" for v in nums)
    return f"<solution>{text}</solution><summary>{n} numbers from {min(nums):.3f} to {max(nums):.3f}</summary>"


def _circles(parent: str | None, k: int) -> list[tuple[float, float, float]]:
    rows = []
    for line in (parent or "").splitlines():
        nums = [float(v) for v in _NUMBER.findall(line)]
        if len(nums) == 3:
            rows.append(tuple(nums))
    if len(rows) == k:
        return rows
    return [((i + 0.5) / k, 0.5, 0.1 / k) for i in range(k)]


register_executor("keywords", keyword_executor)
