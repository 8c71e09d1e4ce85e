"""What the pages show of candidates, records and diffs, derived from what the API answers."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any


@dataclass
class TaskRow:
    """One task of an evaluation: the candidate's and the serving release's mean scores."""

    task: str
    candidate: float | None
    current: float | None
    episodes: int
    crashed_candidate: int
    crashed_current: int

    @property
    def outcome(self) -> str:
        if self.candidate is None or self.current is None:
            return "–"
        return "win" if self.candidate > self.current else "loss" if self.candidate < self.current else "tie"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def evaluation_table(evaluation: dict[str, Any] | None, episodes: list[dict[str, Any]]) -> list[TaskRow]:
    """Per task: mean score of each side (from the evaluation's paired score lists), episodes,
    and the crashed episodes (an error recorded) of each side (from the stored episodes)."""
    if not evaluation:
        return []
    tasks = evaluation.get("tasks") or []
    cand, cur = evaluation.get("candidate_scores") or [], evaluation.get("current_scores") or []
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"candidate": [], "current": []})
    order: list[str] = []
    for i, task in enumerate(tasks):
        task = str(task)
        if task not in scores:
            order.append(task)
        if i < len(cand) and cand[i] is not None:
            scores[task]["candidate"].append(float(cand[i]))
        if i < len(cur) and cur[i] is not None:
            scores[task]["current"].append(float(cur[i]))
    crashed: dict[tuple[str, str], int] = defaultdict(int)
    counted: dict[str, int] = defaultdict(int)
    for ep in episodes:
        task = str(ep.get("task_id"))
        if task not in scores:
            order.append(task)
            scores[task]  # noqa: B018 - creates the task's entry
        counted[task] += 1
        if ep.get("error"):
            crashed[(task, ep.get("side", ""))] += 1
    return [TaskRow(task=t, candidate=_mean(scores[t]["candidate"]), current=_mean(scores[t]["current"]),
                    episodes=counted.get(t, len(scores[t]["candidate"]) + len(scores[t]["current"])),
                    crashed_candidate=crashed[(t, "candidate")], crashed_current=crashed[(t, "current")])
            for t in order]


def recipe_metadata(artifact: dict[str, Any] | None) -> dict[str, Any]:
    """The recipe's metadata, split into what the candidate page shows by name: rules added,
    skills changed with their rationale, training metrics; ``other`` keeps the rest."""
    meta = dict((artifact or {}).get("metadata") or {})
    out: dict[str, Any] = {"rules": [], "skills": [], "metrics": {}, "other": {}}
    if isinstance(meta.get("added_rules"), list):
        out["rules"] = [str(r) for r in meta.pop("added_rules")]
    # recipes namespace their metadata under their name ({"skillclaw": {...}}, {"sao": {...}})
    for key, value in list(meta.items()):
        if not isinstance(value, dict):
            continue
        if isinstance(value.get("changes"), list):
            rationale = value.get("rationale") or {}
            for change in value["changes"]:
                if isinstance(change, dict):
                    why = rationale.get(change.get("name")) if isinstance(rationale, dict) else None
                    out["skills"].append({"op": change.get("op"), "name": change.get("name"),
                                          "fields": change.get("fields") or [], "rationale": why})
        if isinstance(value.get("metrics"), dict):
            out["metrics"].update({f"{key}.{k}": v for k, v in value["metrics"].items()})
    if isinstance(meta.get("metrics"), dict):
        out["metrics"].update(meta["metrics"])
    out["other"] = meta
    return out


def diff_lines(diff: str | None) -> list[tuple[str, str]]:
    """A unified diff as (css class, line) pairs: ``add``, ``del``, ``hunk``, ``file`` or ``ctx``."""
    out = []
    for line in (diff or "").splitlines():
        if line.startswith(("+++", "---", "diff --git", "index ")):
            kind = "file"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        elif line.startswith("@@"):
            kind = "hunk"
        else:
            kind = "ctx"
        out.append((kind, line))
    return out


def answer_text(response: Any) -> str:
    """The answer's text from a stored response of any route (chat, messages, responses)."""
    if not isinstance(response, dict):
        return "" if response is None else str(response)
    parts: list[str] = []
    for choice in response.get("choices") or []:
        msg = (choice or {}).get("message") or {}
        if isinstance(msg.get("content"), str):
            parts.append(msg["content"])
    for block in response.get("content") or []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    for item in response.get("output") or []:
        for block in (item or {}).get("content") or [] if isinstance(item, dict) else []:
            if isinstance(block, dict) and block.get("type") in ("output_text", "text"):
                parts.append(str(block.get("text", "")))
    return "\n".join(parts)


def token_count(record: dict[str, Any]) -> dict[str, Any]:
    """Prompt/completion token counts from the record's usage (any dialect) or its token ids."""
    usage = record.get("usage") or {}
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    if prompt is None and record.get("prompt_token_ids") is not None:
        prompt = len(record["prompt_token_ids"])
    if completion is None and record.get("response_token_ids") is not None:
        completion = len(record["response_token_ids"])
    total = usage.get("total_tokens")
    if total is None and prompt is not None and completion is not None:
        total = prompt + completion
    return {"prompt": prompt, "completion": completion, "total": total}
