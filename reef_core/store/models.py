"""Database tables (SQLModel). SQLite by default, PostgreSQL by URL.

Schema changes go through Alembic migrations in ``migrations/``; never edit a table here
without adding a migration.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, Index, LargeBinary, Text, UniqueConstraint
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def storable(text: str) -> bool:
    """Whether ``text`` can be an id in the store: PostgreSQL's text type cannot hold NUL, so
    such an id was never stored, and asking the database for it would be an error, not a miss."""
    return isinstance(text, str) and "\x00" not in text


def _json(**kw: Any) -> Any:
    return Field(default=None, sa_column=Column(JSON, **kw))


class Record(SQLModel, table=True):
    """One inference: what was asked, what was answered, and which release answered it."""

    __tablename__ = "records"
    __table_args__ = (
        Index("ix_records_scenario_seq", "scenario", "seq"),
        Index("ix_records_scenario_session", "scenario", "session"),
    )

    seq: int | None = Field(default=None, primary_key=True)
    id: str = Field(index=True, unique=True, max_length=64)
    scenario: str = Field(max_length=200)
    kind: str = Field(default="inference", max_length=32)
    session: str | None = Field(default=None, max_length=200)
    tags: dict | None = _json()
    created_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None
    release_id: str | None = Field(default=None, max_length=100)
    runtime: str | None = Field(default=None, max_length=100)
    model: str | None = Field(default=None, max_length=200)
    route: str | None = Field(default=None, max_length=64)
    request: dict | None = _json()
    response: Any = _json()
    status: str = Field(default="ok", max_length=16)  # ok | error | incomplete
    error: str | None = Field(default=None, sa_column=Column(Text))
    latency_ms: float | None = None
    usage: dict | None = _json()
    prompt_token_ids: list | None = _json()
    response_token_ids: list | None = _json()
    logprobs: list | None = _json()
    # The temperature the logprobs were computed at (log_softmax(logits / T) of each sampled
    # token): weight recipes need it to recompute the same quantity under a new policy.
    logprobs_temperature: float | None = None
    # Per response token, the policy's most likely tokens as [token_id, logprob] pairs, when the
    # scenario's recipe asked the runtime for them (Recipe.top_logprobs); null otherwise.
    top_logprobs: list | None = _json()
    finish_reason: str | None = Field(default=None, max_length=32)
    adapter: str | None = Field(default=None, max_length=200)
    content_hash: str | None = Field(default=None, max_length=64, index=True)


class Report(SQLModel, table=True):
    """Feedback that quotes receipts: a score and/or feedback on an ordered trajectory."""

    __tablename__ = "reports"
    __table_args__ = (Index("ix_reports_scenario_seq", "scenario", "seq"),)

    seq: int | None = Field(default=None, primary_key=True)
    id: str = Field(index=True, unique=True, max_length=200)
    scenario: str = Field(max_length=200)
    score: float | None = None
    feedback: Any = _json()
    references: list | None = _json()
    meta: dict | None = Field(default=None, sa_column=Column("metadata", JSON))
    body_hash: str = Field(max_length=64)
    created_at: datetime = Field(default_factory=utcnow)


class ReportReference(SQLModel, table=True):
    """Which records a report quotes, in order (so a record's reports are one lookup)."""

    __tablename__ = "report_references"

    report_id: str = Field(primary_key=True, max_length=200)
    position: int = Field(primary_key=True)
    record_id: str = Field(index=True, max_length=64)


class Consumption(SQLModel, table=True):
    """A record or report a candidate was built from. The primary key makes consumption unique:
    one row per item, naming the candidate that holds it now (or held it last).

    ``state`` says what became of it: ``held`` (a candidate holds it: running, published,
    skipped), ``returned`` (the candidate was rejected, undecided, errored or lost a conflict; the item is back
    in the pool once the return rule allows, see ``reef_core.observe.eligibility``) or
    ``spent`` (attempted ``loop.max_attempts`` times; consumed for good).
    """

    __tablename__ = "consumption"

    item_id: str = Field(primary_key=True, max_length=200)
    item_kind: str = Field(max_length=16)  # record | report
    candidate_id: str = Field(index=True, max_length=64)
    scenario: str = Field(max_length=200)
    created_at: datetime = Field(default_factory=utcnow)
    state: str = Field(default="held", max_length=16)  # held | returned | spent
    #: how many candidates consumed the item so far
    attempts: int = 1
    #: when returned: the release the returning candidate was built on (the rule's condition a)
    base_release_id: str | None = Field(default=None, max_length=100)
    #: when returned: the scenario's newest report seq at that moment (the rule's condition b)
    returned_after_seq: int | None = None


class CandidateRow(SQLModel, table=True):
    """A proposed update, its evaluation and the decision taken on it."""

    __tablename__ = "candidates"
    __table_args__ = (Index("ix_candidates_scenario_created", "scenario", "created_at"),)

    seq: int | None = Field(default=None, primary_key=True)
    id: str = Field(index=True, unique=True, max_length=64)
    scenario: str = Field(max_length=200)
    recipe: str = Field(max_length=100)
    base_release_id: str | None = Field(default=None, max_length=100)
    summary: str | None = Field(default=None, sa_column=Column(Text))
    artifact: dict | None = _json()
    evaluation: dict | None = _json()
    # proposed | evaluating | selected | rejected | undecided | error | conflict | fenced | published
    status: str = Field(default="proposed", max_length=16)
    decision: str | None = Field(default=None, max_length=16)  # select | reject | undecided | error
    reason: str | None = Field(default=None, sa_column=Column(Text))
    release_id: str | None = Field(default=None, max_length=100)
    created_at: datetime = Field(default_factory=utcnow)
    decided_at: datetime | None = None
    #: the fencing token of the growth lease its step held (``GrowthLease``); null before 0006
    lease_token: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))


class GrowthLease(SQLModel, table=True):
    """Who may run a growth step of a scenario, across every process sharing the store
    (``reef_core.store.leases``). Times are seconds since the epoch on the database's clock.

    ``token`` grows by one on every acquisition: the fencing token a step's candidate carries,
    checked when it publishes, so a holder that lost its lease (paused, partitioned, expired)
    can never publish.
    """

    __tablename__ = "growth_leases"

    scenario: str = Field(primary_key=True, max_length=200)
    holder: str = Field(max_length=200)  # host:pid:uuid of the holding process
    token: int = Field(sa_column=Column(BigInteger, nullable=False))
    expires_at: float
    heartbeat_at: float
    acquired_at: float


class EpisodeRow(SQLModel, table=True):
    """One evaluation episode of a candidate (``reef_core.types.Episode``), stored compactly.

    ``request`` is the body as sent, as zlib-compressed JSON; the request of the first episode
    of the same side (``request_base``, a position) is the compression dictionary, so the
    harness text every episode of a side repeats is stored about once per candidate and side
    (``reef_core.store.episodes``).
    """

    __tablename__ = "episodes"

    candidate_id: str = Field(primary_key=True, max_length=64)
    position: int = Field(primary_key=True)
    task_id: str = Field(sa_column=Column(Text, nullable=False))
    side: str = Field(sa_column=Column(Text, nullable=False))  # candidate | current
    repeat: int = 0
    score: float | None = None
    grader: str = Field(sa_column=Column(Text, nullable=False))
    latency_ms: float | None = None
    error: str | None = Field(default=None, sa_column=Column(Text))
    answer: str | None = Field(default=None, sa_column=Column(Text))
    request: bytes | None = Field(default=None, sa_column=Column(LargeBinary))
    request_base: int | None = None


class Release(SQLModel, table=True):
    """One link of a scenario's append-only release chain."""

    __tablename__ = "releases"
    __table_args__ = (UniqueConstraint("scenario", "sequence", name="uq_releases_scenario_sequence"),)

    seq: int | None = Field(default=None, primary_key=True)
    scenario: str = Field(index=True, max_length=200)
    sequence: int
    release_id: str = Field(index=True, unique=True, max_length=100)
    parent_id: str | None = Field(default=None, max_length=100)
    content_hash: str = Field(max_length=64)
    operation: str = Field(max_length=16)  # initial | train | rollback
    git_commit: str | None = Field(default=None, max_length=64)
    candidate_id: str | None = Field(default=None, max_length=64)
    evaluation: dict | None = _json()
    created_at: datetime = Field(default_factory=utcnow)


def to_json(row: SQLModel) -> dict[str, Any]:
    """A row as JSON-ready data (datetimes as ISO strings; ``meta`` shown as ``metadata``)."""
    data = row.model_dump(mode="json")
    if "meta" in data:
        data["metadata"] = data.pop("meta")
    return data
