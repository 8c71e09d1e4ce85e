"""Plain value types passed between the kernel and plugins.

Database rows live in ``reef_core.store.models``; these are the in-memory shapes that
recipes, evaluators and runtimes exchange, so plugins never depend on the ORM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

UpdateTarget = Literal["harness", "adapter", "weights", "none"]
Outcome = Literal["select", "reject", "error"]


@dataclass(frozen=True)
class ActiveRelease:
    """The release a scenario serves: its id, content hash and materialized artifact directory.

    ``path`` holds ``harness/`` and/or ``adapter/`` as published; it is None before the
    scenario's first release.
    """

    scenario: str
    release_id: str
    content_hash: str = ""
    path: Path | None = None

    @property
    def adapter_dir(self) -> Path | None:
        if self.path is None:
            return None
        d = self.path / "adapter"
        return d if d.is_dir() else None

    @property
    def harness_dir(self) -> Path | None:
        if self.path is None:
            return None
        d = self.path / "harness"
        return d if d.is_dir() else None


@dataclass
class InferenceCall:
    """One model call as a runtime sees it.

    ``body`` is a provider request body in ``dialect`` (the runtime's own dialect: the server
    translates before calling). A runtime may fill ``extras`` with what the record should keep
    beyond the response body: ``prompt_token_ids``, ``response_token_ids``, ``logprobs``
    (per response token), ``adapter`` (the adapter version that produced them).
    """

    scenario: str
    record_id: str
    body: dict[str, Any]
    dialect: str = "openai"
    release: ActiveRelease | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class Candidate:
    """An update a recipe proposes: an artifact directory plus what it was made from."""

    scenario: str
    recipe: str
    artifact_dir: Path
    base_release_id: str | None = None
    summary: str = ""
    record_ids: list[str] = field(default_factory=list)
    report_ids: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    id: str = ""


@dataclass
class Evaluation:
    """What an evaluator measured: per-task scores for candidate and current (None = crashed)."""

    evaluator: str
    candidate_scores: list[float | None] = field(default_factory=list)
    current_scores: list[float | None] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "evaluator": self.evaluator,
            "candidate_scores": self.candidate_scores,
            "current_scores": self.current_scores,
            "tasks": self.tasks,
            "metrics": self.metrics,
            "error": self.error,
        }


@dataclass(frozen=True)
class Decision:
    """The evaluator's verdict on a candidate."""

    outcome: Outcome
    reason: str = ""
