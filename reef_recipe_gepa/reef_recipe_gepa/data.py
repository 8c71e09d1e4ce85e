"""GEPA's data in Reef: live reports are the train set, the scenario's task suite the validation set.

A train example is one report quoting a record: the recorded request is the input, the recorded
answer the output, the report's score its score and the report's feedback text what the
reflection model reads (a sentence restating the score when the report has none). A validation
example is one task of ``evaluator.tasks`` (``{id?, prompt | messages, system?, expected?,
pattern?, grader?}``), graded as the ``task_suite`` evaluator grades it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reef_core import Batch, ConfigError, Grader
from reef_core.kit import chat_request, content_text

#: request fields that make no sense for an episode re-run by the recipe
_DROP = ("stream", "stream_options", "n")


def default_feedback(score: float | None) -> str:
    """The feedback of a report that gave a score and no text."""
    if score is None:
        return "The user gave no score and no feedback for this answer."
    return f"The user scored this answer {score:.2f} on a scale from 0 (bad) to 1 (good) and gave no further feedback."


def response_text(response: Mapping[str, Any] | None) -> str:
    """The answer text of an OpenAI or Anthropic response body."""
    if not response:
        return ""
    choices = response.get("choices")
    if isinstance(choices, list) and choices:
        return content_text((choices[0].get("message") or {}).get("content"))
    return content_text(response.get("content"))


def request_view(request: Mapping[str, Any]) -> str:
    """The request as the reflection model reads it: its messages, one per line, roles named."""
    lines = []
    if request.get("system"):
        lines.append(f"system: {content_text(request['system'])}")
    for m in request.get("messages") or []:
        if isinstance(m, dict):
            lines.append(f"{m.get('role', 'user')}: {content_text(m.get('content'))}")
    return "\n".join(lines)


def train_examples(batch: Batch) -> list[dict[str, Any]]:
    """One train example per report and quoted record with a request and an answer, oldest first."""
    out = []
    for exp in batch:
        text = exp.feedback_text() if hasattr(exp, "feedback_text") else None
        feedback = text or default_feedback(exp.score)
        reference = {k: exp.metadata[k] for k in ("expected", "pattern", "grader")
                     if isinstance(exp.metadata, Mapping) and exp.metadata.get(k)}
        for rec in exp.records:
            # a /v1/responses record (Codex, the Agents SDK) replays as the chat request it stands for
            body = chat_request(rec.request) if getattr(rec, "route", None) == "openai.responses" else rec.request
            if not body or not body.get("messages"):
                continue
            request = {k: v for k, v in body.items() if k not in _DROP}
            out.append({"kind": "train", "id": f"{exp.report_id}/{rec.id}", "request": request,
                        "answer": rec.response_text(), "release_id": rec.release_id, "score": exp.score,
                        "feedback": feedback,
                        "reference": reference})
    return out


def load_valset(tasks: Sequence[Mapping[str, Any]] | str | None, default_grader: str,
                graders: Mapping[str, Grader], key: str) -> list[dict[str, Any]]:
    """The validation tasks from ``evaluator.tasks`` (a list or a JSONL path); ConfigError naming ``key``."""
    if not tasks:
        raise ConfigError(f"recipe 'gepa' needs a validation set and {key} is not set: give the scenario's "
                          f"task suite there (a list of {{prompt, expected}} tasks or a JSONL file path)")
    if isinstance(tasks, (str, Path)):
        path = Path(tasks).expanduser()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read {key} file {str(path)!r}: {exc.strerror}") from None
        try:
            items = [json.loads(line) for line in lines if line.strip()]
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{key} file {str(path)!r} is not JSON Lines ({exc.msg})") from None
    else:
        items = [dict(t) for t in tasks]
    if not items:
        raise ConfigError(f"recipe 'gepa' needs a validation set and {key} holds no task")
    out = []
    for n, task in enumerate(items, 1):
        if not isinstance(task, Mapping) or not (task.get("prompt") or task.get("messages")):
            raise ConfigError(f"{key}: task {n} needs 'prompt' or 'messages'")
        task = dict(task)
        task.setdefault("id", f"task-{n}")
        task.setdefault("grader", "regex" if task.get("pattern") else default_grader)
        if task["grader"] not in graders:
            raise ConfigError(f"{key}: task {task['id']!r} names unknown grader {task['grader']!r}; "
                              f"available: {', '.join(sorted(graders))}")
        out.append({"kind": "val", "id": str(task["id"]), "task": task})
    return out


def fingerprint(items: Sequence[Mapping[str, Any]]) -> str:
    """What makes two validation sets the same (the archive's score vectors are per task)."""
    return hashlib.sha256(json.dumps([i["task"] for i in items], sort_keys=True, default=str).encode()).hexdigest()[:16]

