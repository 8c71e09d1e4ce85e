"""Test helpers for the SAO recipe and its users: experiences whose records carry real sampling
logprobs from a local model directory (e.g. ``reef_train.testing.build_tiny_model``'s). The tiny
model, its tokenizer and a trainable runtime on it are reef-train's pytest fixtures
(``tiny_model_dir``, ``tokenizer``, ``trainable_runtime``)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from reef_core import ActiveRelease, Batch, Experience, ExperienceRecord
from reef_core.testing import recipe_context
from reef_train.testing import sample_rollouts

SCENARIO = "kit"


def record(i: int, prompt: list[int], response: list[int], logprobs: list[float] | None, *,
           release_id: str | None = None, temperature: float | None = 1.0) -> ExperienceRecord:
    return ExperienceRecord(
        id=f"rec{i}", scenario=SCENARIO, session=None, release_id=release_id, created_at=None, status="ok",
        model="tiny", route="openai.chat", request={"messages": [{"role": "user", "content": f"q{i}"}]},
        response={"choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}}]},
        prompt_token_ids=prompt, response_token_ids=response, logprobs=logprobs, seq=i + 1,
        logprobs_temperature=temperature)


def experience(i: int, score: float | None, *records: ExperienceRecord) -> Experience:
    return Experience(report_id=f"rep{i}", scenario=SCENARIO, score=score, feedback=None, metadata={},
                      created_at=datetime.now(timezone.utc), records=tuple(records))


def sampled_batch(model_dir: Path, prompts: list[list[int]], score, *, adapter_dir: Path | None = None,
                  release_id: str | None = None, seed: int = 0, max_new_tokens: int = 4,
                  num_samples: int = 1) -> Batch:
    """Rollouts of ``prompts`` from the tiny model (with ``adapter_dir``), each scored by
    ``score(response_ids)``: one single-reference experience per rollout."""
    samples = sample_rollouts(model_dir, prompts, adapter_dir=adapter_dir, seed=seed, num_samples=num_samples,
                              max_new_tokens=max_new_tokens)
    items = [experience(i, float(score(s.response_ids)),
                        record(i, s.prompt_ids, s.response_ids, s.logprobs, release_id=release_id))
             for i, s in enumerate(samples)]
    return Batch(SCENARIO, items)


def context(tmp: Path, current: ActiveRelease | None, runtime, name: str = "scratch", settings=None):
    return recipe_context(Path(tmp) / name, current, recipe="sao", runtime=runtime, settings=settings)


def release_of(artifact: Path, release_id: str) -> ActiveRelease:
    return ActiveRelease(scenario=SCENARIO, release_id=release_id, content_hash="", path=Path(artifact))
