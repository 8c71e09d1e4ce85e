"""``ReefHarnessAdapter``: GEPA's adapter interface (``gepa.GEPAAdapter``) over a Reef scenario.

- A GEPA candidate is ``{component: text}`` for the harness files the recipe evolves
  (``system.md``, ``rules.md``, ``skills/<name>/SKILL.md``, relative to ``harness/``).
- ``evaluate`` runs each example as an episode: the candidate's texts are written into a scratch
  copy of the serving artifact, and the request goes through ``ctx.complete(body, release)``
  with that copy as the release, so the scenario's runtime answers with the candidate's harness
  applied exactly as serving applies it. Validation tasks are graded like ``task_suite`` grades
  them. A train example (a live report) scored on the served candidate reuses the recorded
  answer and the report's score when the serving release gave that answer, which costs no
  metric call; on any other candidate the fresh
  answer is graded by the report's reference (``expected``/``pattern`` in its metadata) when it
  has one, otherwise by the judge.
- ``make_reflective_dataset`` gives the reflection model, per component, each example's request
  (``Inputs``), answer (``Generated Outputs``) and feedback (``Feedback``): the report's text for
  recorded answers, the grade and the judge's reason for fresh ones.
- ``propose_new_texts`` is left to GEPA (its reflection prompt and the reflection model).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gepa.core.adapter import EvaluationBatch

from reef_core import ActiveRelease
from reef_core.kit import task_body

from .data import Grader, request_view, response_text
from .models import LanguageModel, judge


def candidate_key(candidate: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(candidate.items())).encode()).hexdigest()[:16]


def write_components(harness: Path, candidate: Mapping[str, str], base: Mapping[str, str]) -> None:
    """Write ``candidate``'s texts under ``harness/``; an empty text removes a file the base lacked."""
    for name, text in candidate.items():
        path = harness / name
        if not text and not base.get(name) and not path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")  # as is: the served text must equal the archive's


class ReefHarnessAdapter:
    """GEPA's three adapter duties (evaluate, make_reflective_dataset, propose: GEPA's own) for
    a Reef scenario's harness. ``episodes`` counts the model calls it made (metric calls)."""

    propose_new_texts = None

    def __init__(self, ctx: Any, *, base: Path | None, served: Mapping[str, str], graders: Mapping[str, Grader],
                 judge_lm: LanguageModel | None, model: str, params: Mapping[str, Any],
                 episode_timeout_s: float, concurrency: int, scratch: Path, served_release_id: str | None = None):
        self.ctx = ctx
        self.base = base  # the serving artifact (None before the first release)
        self.served = dict(served)
        self.served_release_id = served_release_id
        self.graders = graders
        self.judge_lm = judge_lm
        self.model = model
        self.params = dict(params)
        self.episode_timeout_s = episode_timeout_s
        self.concurrency = max(1, int(concurrency))
        self.scratch = scratch
        self.episodes = 0
        self._releases: dict[str, ActiveRelease] = {}
        # episodes of one batch run on a thread pool and ask for the same candidate's release
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ GEPAAdapter

    def evaluate(self, batch: list[dict[str, Any]], candidate: dict[str, str],
                 capture_traces: bool = False) -> EvaluationBatch:
        served = dict(candidate) == self.served
        jobs: list[Callable[[], dict[str, Any]]] = [
            (lambda ex=ex: self._recorded(ex)) if served and self.recorded_here(ex)
            else (lambda ex=ex: self._episode(ex, candidate))
            for ex in batch
        ]
        if self.concurrency > 1 and len(jobs) > 1:
            with ThreadPoolExecutor(min(self.concurrency, len(jobs)), thread_name_prefix="reef-gepa") as pool:
                results = list(pool.map(lambda job: job(), jobs))
        else:
            results = [job() for job in jobs]
        calls = sum(1 for r in results if r["ran"])
        self.episodes += calls
        return EvaluationBatch(outputs=[r["output"] for r in results], scores=[r["score"] for r in results],
                               trajectories=results if capture_traces else None, num_metric_calls=calls)

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: EvaluationBatch,
                                components_to_update: list[str]) -> dict[str, list[dict[str, Any]]]:
        records = []
        for trace in eval_batch.trajectories or []:
            ex = trace["example"]
            inputs = request_view(ex["request"]) if ex["kind"] == "train" else request_view(
                task_body(ex["task"], "openai", self.model, {}))
            records.append({"Inputs": inputs, "Generated Outputs": trace["output"], "Feedback": trace["feedback"]})
        return {name: list(records) for name in components_to_update}

    # ------------------------------------------------------------------ episodes

    def recorded_here(self, ex: Mapping[str, Any]) -> bool:
        """Whether ``ex`` is a live answer the serving release gave (its score needs no episode)."""
        return ex["kind"] == "train" and bool(ex.get("answer")) and ex.get("release_id") == self.served_release_id

    def _recorded(self, ex: Mapping[str, Any]) -> dict[str, Any]:
        score = float(ex["score"]) if ex.get("score") is not None else 0.0
        return {"example": ex, "output": ex["answer"], "score": score, "feedback": ex["feedback"], "ran": False}

    def _episode(self, ex: Mapping[str, Any], candidate: Mapping[str, str]) -> dict[str, Any]:
        release = self.release_for(candidate)
        if ex["kind"] == "val":
            body = task_body(ex["task"], self.ctx.runtime.dialect, self.model, self.params)
        else:
            body = dict(ex["request"])
        try:
            output = response_text(self.ctx.complete(body, release, timeout_s=self.episode_timeout_s))
        except Exception as exc:  # noqa: BLE001 - an episode that fails scores 0 and says why
            return {"example": ex, "output": "", "score": 0.0, "ran": True,
                    "feedback": f"The episode failed: {type(exc).__name__}: {exc}"}
        try:
            score, feedback = self._grade(ex, output)
            if not math.isfinite(score):  # NaN ranks as nothing, inf above every candidate
                raise ValueError(f"the grader returned {score!r}, not a finite score")
        except Exception as exc:  # noqa: BLE001 - a grader or judge error scores 0
            score, feedback = 0.0, f"Grading failed: {type(exc).__name__}: {exc}"
        return {"example": ex, "output": output, "score": score, "feedback": feedback, "ran": True}

    def _grade(self, ex: Mapping[str, Any], output: str) -> tuple[float, str]:
        if ex["kind"] == "val":
            task = ex["task"]
            score = float(self.graders[task["grader"]](output, task))
            want = task.get("expected") or task.get("pattern")
            return score, ("Correct." if score >= 1.0 else f"Scored {score:.2f}; the expected answer is {want!r}.")
        ref = ex.get("reference") or {}
        if ref.get("expected") or ref.get("pattern"):
            task = {"grader": "regex" if ref.get("pattern") and not ref.get("expected") else "contains", **ref}
            score = float(self.graders[task["grader"]](output, task))
            return score, (f"Scored {score:.2f} against the reference. The user's feedback on an earlier answer: "
                           f"{ex['feedback']}")
        if " ".join(output.split()) == " ".join(str(ex.get("answer") or "").split()):
            return self._recorded(ex)["score"], ex["feedback"]
        if self.judge_lm is None:  # judge: none, unverifiable answers keep the recorded score
            return self._recorded(ex)["score"], ex["feedback"]
        score, reason = judge(self.judge_lm, ex, output)
        return score, f"Judged {score:.2f}: {reason} The user's feedback on an earlier answer: {ex['feedback']}"

    def release_for(self, candidate: Mapping[str, str]) -> ActiveRelease:
        """A scratch release serving ``candidate``'s harness (built once per candidate)."""
        with self._lock:
            return self._release_for(candidate)

    def _release_for(self, candidate: Mapping[str, str]) -> ActiveRelease:
        key = candidate_key(candidate)
        found = self._releases.get(key)
        if found is not None:
            return found
        root = self.scratch / key
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        if self.base is not None and (self.base / "harness").is_dir():
            shutil.copytree(self.base / "harness", root / "harness")
        if self.base is not None and (self.base / "adapter").is_dir():
            (root / "adapter").symlink_to((self.base / "adapter").resolve(), target_is_directory=True)
        (root / "harness").mkdir(exist_ok=True)
        write_components(root / "harness", candidate, self.served)
        release = ActiveRelease(scenario=self.ctx.scenario, release_id=f"gepa:{key}", content_hash=key, path=root)
        self._releases[key] = release
        return release


def component_texts(harness: Path | None, components: Sequence[str]) -> dict[str, str]:
    """``{component: text}`` of a harness directory (empty text for a missing file)."""
    out = {}
    for name in components:
        path = harness / name if harness is not None else None
        out[name] = path.read_text(encoding="utf-8") if path is not None and path.is_file() else ""
    return out
