"""The batch shape recipes receive: experiences built from reports and the records they quote.

An :class:`Experience` is one report (a score and/or feedback) together with the records it
quotes, in the order the report listed them (one ordered trajectory). Recipes never see ORM
rows: these are plain, frozen values, so a recipe written against them does not depend on
the database layer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def record_content_hash(request: Any, response: Any) -> str:
    """SHA-256 of canonical JSON ``[request, response]``: what the ``dedup`` filter compares.

    A server that stores this as ``Record.content_hash`` lets ``dedup`` also drop content
    that an earlier candidate already consumed (one indexed query instead of re-reading bodies).
    """
    canonical = json.dumps([request, response], sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class ExperienceRecord:
    """One served request as a recipe sees it (a read-only copy of a stored record)."""

    id: str
    scenario: str
    session: str | None
    release_id: str | None
    created_at: datetime | None
    status: str
    model: str | None
    route: str | None
    request: dict[str, Any] | None
    response: Any
    tags: dict[str, Any] | None = None
    content_hash: str | None = None
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    adapter: str | None = None
    seq: int | None = None
    #: the temperature ``logprobs`` were taken at (``log_softmax(logits / T)``), as the runtime said
    logprobs_temperature: float | None = None
    #: per response token, the most likely tokens as ``[token_id, logprob]`` pairs (most likely
    #: first, same convention as ``logprobs``) when the recipe asked for them, else None
    top_logprobs: list[list[list[float]]] | None = None

    @classmethod
    def from_row(cls, row: Any) -> ExperienceRecord:
        return cls(
            id=row.id, scenario=row.scenario, session=row.session, release_id=row.release_id,
            created_at=row.created_at, status=row.status, model=row.model, route=row.route,
            request=row.request, response=row.response, tags=row.tags,
            content_hash=row.content_hash, prompt_token_ids=row.prompt_token_ids,
            response_token_ids=row.response_token_ids, logprobs=row.logprobs,
            adapter=row.adapter, seq=row.seq, logprobs_temperature=row.logprobs_temperature,
            top_logprobs=row.top_logprobs,
        )

    @property
    def content_key(self) -> str:
        """A hash of what was asked and answered: the stored ``content_hash`` when the server
        computed one, otherwise ``record_content_hash`` of request and response."""
        return self.content_hash or record_content_hash(self.request, self.response)

    def response_text(self) -> str:
        """The assistant's answer as plain text (OpenAI or Anthropic response body)."""
        return response_text(self.response)


@dataclass(frozen=True)
class Experience:
    """One report and the ordered records it quotes: the unit recipes learn from.

    ``session_records`` holds the other turns of the same ``x-reef-session`` when the
    ``session`` filter assembled them; they are context only and are not consumed.
    """

    report_id: str
    scenario: str
    score: float | None
    feedback: Any
    metadata: dict[str, Any]
    created_at: datetime | None
    records: tuple[ExperienceRecord, ...]
    session_records: tuple[ExperienceRecord, ...] = ()
    report_seq: int | None = None

    @property
    def record_ids(self) -> list[str]:
        return [r.id for r in self.records]

    @property
    def session(self) -> str | None:
        """The session of the quoted records (the first one that has a session)."""
        return next((r.session for r in self.records if r.session), None)

    def feedback_text(self) -> str:
        """The feedback as text: a string as is, an object's ``text``/``comment``/``feedback``
        field when present, otherwise compact JSON; empty when there is none."""
        fb = self.feedback
        if fb is None:
            return ""
        if isinstance(fb, str):
            return fb.strip()
        if isinstance(fb, dict):
            for key in ("text", "comment", "feedback", "message"):
                if isinstance(fb.get(key), str):
                    return fb[key].strip()
        return json.dumps(fb, sort_keys=True, ensure_ascii=False)


@dataclass
class Batch:
    """What ``Recipe.propose`` receives: the eligible experiences of one scenario, oldest first."""

    scenario: str
    items: list[Experience] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    @property
    def report_ids(self) -> list[str]:
        return [e.report_id for e in self.items]

    @property
    def record_ids(self) -> list[str]:
        return list(dict.fromkeys(rid for e in self.items for rid in e.record_ids))


def response_text(body: Any) -> str:
    """Plain text of an OpenAI chat completion, Responses API response or Anthropic message body."""
    if not isinstance(body, dict):
        return "" if body is None else str(body)
    if body.get("object") == "response":  # the Responses API: the text of its message items
        return "".join(str(part.get("text", "")) for item in body.get("output") or []
                       if isinstance(item, dict) and item.get("type") == "message"
                       for part in item.get("content") or []
                       if isinstance(part, dict) and part.get("type") == "output_text")
    choices = body.get("choices")
    if isinstance(choices, list) and choices:
        msg = choices[0].get("message") or {}
        return _content_text(msg.get("content"))
    if body.get("type") == "message" or "content" in body:
        return _content_text(body.get("content"))
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and part.get("type") in ("text", None))
    return ""
