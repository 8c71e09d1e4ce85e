"""Test helpers for the OpenClaw recipe and its users: scripted judges, records with token
capture on a local model directory (e.g. ``reef_train.testing.build_tiny_model``'s), and a
runtime that serves such records over HTTP without a model (``ScriptedTrainable``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from reef_core import ExperienceRecord, InferenceCall, ServedBase
from reef_core.testing import EchoRuntime
from reef_train.prompts import chat_prompt_ids

from .judge import Judge

SCENARIO = "kit"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


class ScriptedJudge(Judge):
    """A rule-based judge behind the ``Judge`` interface: ``rule(prompt_text) -> answer``.

    The default rule reads the next state: a complaint (``no``, ``wrong``, ``shorter``,
    ``error``) is −1 with a hint to follow it, thanks is +1, anything else 0."""

    def __init__(self, rule: Callable[[str, str], str] | None = None):
        self.rule = rule or complaint_rule
        self.calls: list[list[dict[str, str]]] = []

    async def generate(self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int) -> str:
        self.calls.append(messages)
        return self.rule(messages[0]["content"], messages[-1]["content"])


def next_state_of(prompt: str) -> str:
    """The next-state text in a judge prompt (``reef_recipe_openclaw.prm.conversation_text``)."""
    return prompt.rsplit("):\n", 1)[-1]


def complaint_rule(system: str, prompt: str) -> str:
    nxt = next_state_of(prompt).lower()
    hinting = "HINT_START" in system
    if re.search(r"\b(no|wrong|shorter|error)\b", nxt):
        return ("The user objects. \\boxed{1} [HINT_START]Answer in one short sentence, without lists.[HINT_END]"
                if hinting else "The user corrects it. \\boxed{-1}")
    if "thank" in nxt:
        return "No hint. \\boxed{-1}" if hinting else "Progress. \\boxed{1}"
    return "\\boxed{-1}" if hinting else "Unclear. \\boxed{0}"


def chat_record(rid: str, messages: list[dict[str, Any]], reply: str, *, at: float = 0.0,
                session: str | None = None, tags: dict[str, Any] | None = None, status: str = "ok",
                tools: list[Any] | None = None, tokens: dict[str, Any] | None = None) -> ExperienceRecord:
    """A served OpenAI chat turn as the record store keeps it (``at``: seconds after ``T0``)."""
    request: dict[str, Any] = {"model": "m", "messages": messages}
    if tools:
        request["tools"] = tools
    return ExperienceRecord(
        id=rid, scenario=SCENARIO, session=session, release_id=None, created_at=T0 + timedelta(seconds=at),
        status=status, model="m", route="openai.chat", request=request,
        response={"choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                               "finish_reason": "stop"}]},
        tags=tags, **(tokens or {}))


def token_capture(tokenizer: Any, messages: list[dict[str, Any]], reply: str, top_k: int = 4) -> dict[str, Any]:
    """What the local runtime records for ``reply`` to ``messages`` on ``tokenizer``'s model: the
    prompt as its chat template renders it, the reply's tokens, and made-up logprobs and top-K
    lists (the learner recomputes old logprobs itself; only the ids matter to it)."""
    prompt = chat_prompt_ids(tokenizer, messages)
    response = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    vocab = len(tokenizer)
    top = [[[tok, -0.5]] + [[(tok + j) % vocab, -1.0 - j] for j in range(1, top_k)] for tok in response]
    return {"prompt_token_ids": prompt, "response_token_ids": response, "logprobs": [-0.5] * len(response),
            "top_logprobs": top, "logprobs_temperature": 1.0}


class ScriptedTrainable(EchoRuntime):
    """A runtime offering ``TrainableBase`` on a local model directory that answers with
    ``answer(messages)`` and records what the local runtime would (token ids, logprobs and, when
    the call asks, top-K lists), without running the model."""

    def __init__(self, model_dir: Path, answer: Callable[[list[dict[str, Any]]], str] | None = None):
        super().__init__()
        from transformers import AutoTokenizer

        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.answer = answer or (lambda messages: "ok")

    async def complete(self, call: InferenceCall) -> dict[str, Any]:
        self.calls.append(call)
        messages = call.body.get("messages") or []
        reply = self.answer(messages)
        capture = token_capture(self.tokenizer, messages, reply, max(call.top_logprobs, 1))
        if not call.top_logprobs:
            capture.pop("top_logprobs")
        call.extras.update(capture)
        return {"id": "scripted", "object": "chat.completion", "model": call.body.get("model", "tiny"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}]}

    def models(self) -> list[str]:
        return ["tiny"]

    def trainable_problem(self):
        return None

    def base_model(self) -> ServedBase:
        return ServedBase(path=self.model_dir, model_id="tiny", device="cpu", dtype="float32",
                          eos_token_ids=(self.tokenizer.eos_token_id,))

    def adapter_of(self, release):
        return release.adapter_dir if release is not None else None
