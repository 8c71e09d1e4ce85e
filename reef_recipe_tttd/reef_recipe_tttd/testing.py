"""Test helpers for the TTTD recipe and its users: grids of experiences whose records carry
real sampling logprobs from a local model directory. The tiny model, its tokenizer and a
trainable runtime on it are reef-train's pytest fixtures (``tiny_model_dir``, ``tokenizer``,
``trainable_runtime``)."""

from __future__ import annotations

import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reef_core import Batch, Experience, ExperienceRecord
from reef_train.testing import sample_rollouts

from .tasks import Task, Verdict

SCENARIO = "kit"


def grid_metadata(step: int, group: int, rollout: int, groups: int, rollouts: int, **extra: Any) -> dict[str, Any]:
    return {"step": step, "group": group, "rollout": rollout, "groups_per_step": groups,
            "rollouts_per_group": rollouts, "comparison_set": f"tttd-step-{step}-group-{group}",
            "algorithm": "tttd", **extra}


def record(i: int, prompt: list[int] | None = None, response: list[int] | None = None,
           logprobs: list[float] | None = None, *, release_id: str | None = "rel1") -> ExperienceRecord:
    return ExperienceRecord(
        id=f"rec{i}", scenario=SCENARIO, session=None, release_id=release_id, created_at=None, status="ok",
        model="tiny", route="openai.chat", request={"messages": [{"role": "user", "content": f"q{i}"}],
                                                    "temperature": 1.0},
        response={"choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}}]},
        prompt_token_ids=prompt, response_token_ids=response, logprobs=logprobs, seq=i + 1,
        logprobs_temperature=1.0 if logprobs is not None else None)


def experience(i: int, score: float | None, metadata: dict[str, Any], *records: ExperienceRecord) -> Experience:
    return Experience(report_id=f"rep{i}", scenario=SCENARIO, score=score, feedback=None, metadata=metadata,
                      created_at=datetime.now(timezone.utc), records=tuple(records), report_seq=i + 1)


def scored_grid(rewards: list[list[float]], *, step: int = 0, releases: list[list[str]] | None = None,
                tokens: list[list[tuple[list[int], list[int], list[float]]]] | None = None) -> list[Experience]:
    """A grid of experiences with ``rewards[g][r]`` (records with tokens when given)."""
    groups, rollouts = len(rewards), len(rewards[0])
    out, i = [], step * 1000
    for g in range(groups):
        for r in range(rollouts):
            rel = releases[g][r] if releases else "rel1"
            p, resp, lp = tokens[g][r] if tokens else (None, None, None)
            out.append(experience(i, rewards[g][r], grid_metadata(step, g, r, groups, rollouts),
                                  record(i, p, resp, lp, release_id=rel)))
            i += 1
    return out


def sampled_grid(model_dir: Path, prompt: list[int], score, *, groups: int = 2, rollouts: int = 4, seed: int = 0,
                 max_new_tokens: int = 6, step: int = 0) -> Batch:
    """A G×R grid of rollouts of ``prompt`` from the model in ``model_dir``, scored by ``score(response_ids)``."""
    samples = sample_rollouts(model_dir, [prompt] * groups, seed=seed, num_samples=rollouts,
                              max_new_tokens=max_new_tokens)
    rewards, tokens = [], []
    for g in range(groups):
        row = samples[g * rollouts:(g + 1) * rollouts]
        rewards.append([float(score(s.response_ids)) for s in row])
        tokens.append([(s.prompt_ids, s.response_ids, s.logprobs) for s in row])
    return Batch(SCENARIO, scored_grid(rewards, step=step, tokens=tokens))


class ChecksumTask(Task):
    """A test double, not a discovery problem: any answer is valid and scores its CRC-32 scaled
    to [0, 1), so different answers almost surely score differently. A grid sampled from a
    tiny random model then always carries a learning signal, which the shipped tasks' scorers
    (an answer line of numbers) never give such a model: its steps would propose nothing."""

    name = "checksum"
    max_tokens = 8

    @property
    def instruction(self) -> str:
        return "Write anything."

    def verify(self, output: str) -> Verdict:
        score = zlib.crc32(output.encode()) % 1000 / 1000
        return Verdict(score=score, raw=score, valid=True, message=f"checksum score {score:.3f}")
