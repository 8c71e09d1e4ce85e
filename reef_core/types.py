"""Plain value types passed between the kernel and plugins.

Database rows live in ``reef_core.store.models``; these are the in-memory shapes that
recipes, evaluators, runtimes and observers exchange, so plugins never depend on the ORM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

UpdateTarget = Literal["harness", "adapter", "weights", "none"]
#: a gate's verdict: ``undecided`` when its evidence reached the cap without deciding (not
#: published, like ``reject``, but recorded as its own outcome)
Outcome = Literal["select", "reject", "undecided", "error"]


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


#: ``base_release``'s id: no release's id (those are ``rel_…``)
BASE_RELEASE_ID = "base"


def base_release(scenario: str) -> ActiveRelease:
    """The base model named as a release (no harness, no adapter), for a call that must run on it.

    A call without a release runs on whatever its scenario serves when the runtime takes it up,
    which can be a release swapped in after the server froze "nothing published yet" into the
    record; the server and the gate pass this instead, so answer and record agree.
    """
    return ActiveRelease(scenario=scenario, release_id=BASE_RELEASE_ID)


@dataclass
class InferenceCall:
    """One model call as a runtime sees it.

    ``body`` is a provider request body in ``dialect`` (the runtime's own dialect: the server
    translates before calling). A runtime may fill ``extras`` with what the record should keep
    beyond the response body: ``prompt_token_ids``, ``response_token_ids``, ``logprobs``
    (per response token), ``adapter`` (the adapter version that produced them), and, when
    ``top_logprobs`` is above 0, ``top_logprobs``: per response token the ``top_logprobs``
    most likely tokens as ``[token_id, logprob]`` pairs, most likely first, in the convention
    of ``logprobs`` (what the scenario's recipe asks for: ``Recipe.top_logprobs``).

    ``release`` is what the call runs on: the release the server froze at request start, a
    candidate under evaluation, or ``base_release`` (the base model); None, for a caller that
    does not track releases, means whatever the scenario serves when the runtime takes it up.
    """

    scenario: str
    record_id: str
    body: dict[str, Any]
    dialect: str = "openai"
    release: ActiveRelease | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    #: per response token, how many most likely tokens the runtime should record (0: none)
    top_logprobs: int = 0


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
class Episode:
    """One evaluation episode: one task, run once on one side (``candidate`` or ``current``).

    ``request`` is the body as sent to the runtime (harness applied), ``answer`` the text the
    grader saw, ``score`` its grade (None when the episode crashed; ``error`` says why).
    """

    task_id: str
    side: str
    repeat: int
    request: dict[str, Any]
    answer: str | None
    score: float | None
    grader: str
    latency_ms: float
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "side": self.side, "repeat": self.repeat, "request": self.request,
                "answer": self.answer, "score": self.score, "grader": self.grader,
                "latency_ms": self.latency_ms, "error": self.error}


@dataclass
class Evaluation:
    """What an evaluator measured: per-task scores for candidate and current (None = crashed).

    ``episodes`` holds every episode in full when the evaluator keeps them (the kernel stores
    them with the candidate); ``to_dict`` leaves them out, so the summary stays small.
    """

    evaluator: str
    candidate_scores: list[float | None] = field(default_factory=list)
    current_scores: list[float | None] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    episodes: list[Episode] = field(default_factory=list)

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


def _read_only(value: Any) -> Mapping[str, Any] | None:
    return None if value is None else MappingProxyType(dict(value))


@dataclass(frozen=True)
class StoredReport:
    """A feedback report as observers see it (``report_stored``): a read-only copy of the stored report.

    ``references`` are the receipts (record ids) it quotes, in order; ``metadata`` is a read-only
    mapping. Observers get this instead of the database row, so nothing they do reaches the store.
    """

    id: str
    scenario: str
    score: float | None = None
    feedback: Any = None
    references: tuple[str, ...] = ()
    metadata: Mapping[str, Any] | None = None
    created_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> StoredReport:
        """Copy a stored report row."""
        return cls(id=row.id, scenario=row.scenario, score=row.score, feedback=row.feedback,
                   references=tuple(row.references or ()), metadata=_read_only(row.meta), created_at=row.created_at)


@dataclass(frozen=True)
class PublishedRelease:
    """A link of a scenario's release chain as observers see it (``release_published``).

    ``operation`` is ``initial``, ``train`` or ``rollback``; ``candidate_id`` names the candidate a
    trained release came from; ``evaluation`` (read-only) is what its evaluator measured.
    """

    scenario: str
    release_id: str
    sequence: int
    content_hash: str
    operation: str
    parent_id: str | None = None
    git_commit: str | None = None
    candidate_id: str | None = None
    evaluation: Mapping[str, Any] | None = None
    created_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> PublishedRelease:
        """Copy a release row of the store."""
        return cls(scenario=row.scenario, release_id=row.release_id, sequence=row.sequence,
                   content_hash=row.content_hash, operation=row.operation, parent_id=row.parent_id,
                   git_commit=row.git_commit, candidate_id=row.candidate_id,
                   evaluation=_read_only(row.evaluation), created_at=row.created_at)
