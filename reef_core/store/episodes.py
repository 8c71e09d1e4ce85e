"""Evaluation episodes, stored compactly with their candidate.

Every episode of a side repeats the same long text: the harness the evaluator applied to
each request. So a request is stored as zlib-compressed JSON whose compression dictionary is
the request of the first episode of the same side (``request_base``): what the two share
costs a few bytes, and the first one is stored once, compressed on its own. Answers, errors
and scores stay plain columns, readable in SQL.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import Connection

from .models import CandidateRow, EpisodeRow

#: zlib looks back at most this far, so a longer dictionary helps only with its end
_WINDOW = 32 * 1024


def _text(value: Any) -> str | None:
    """Text PostgreSQL can store (it refuses NUL characters)."""
    return None if value is None else str(value).replace("\x00", "\ufffd")


def _number(value: Any) -> float | None:
    """A finite float, or None (JSON and the routes have no NaN)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _json(request: Any) -> bytes:
    return json.dumps(request, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def _compress(data: bytes, dictionary: bytes | None) -> bytes:
    if dictionary is None:
        return zlib.compress(data, 9)
    packer = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY, dictionary[-_WINDOW:])
    return packer.compress(data) + packer.flush()


def _decompress(blob: bytes, dictionary: bytes | None) -> bytes:
    if dictionary is None:
        return zlib.decompress(blob)
    unpacker = zlib.decompressobj(zdict=dictionary[-_WINDOW:])
    return unpacker.decompress(blob) + unpacker.flush()


def episode_rows(candidate_id: str, episodes: Sequence[Any]) -> list[dict[str, Any]]:
    """Rows of the ``episodes`` table for ``episodes`` (``reef_core.types.Episode``), in order."""
    rows: list[dict[str, Any]] = []
    bases: dict[str, tuple[int, bytes]] = {}  # side -> (position, request JSON) of its first episode
    for position, ep in enumerate(episodes):
        side = _text(ep.side) or ""
        raw = None if ep.request is None else _json(ep.request)
        base = bases.get(side)
        if raw is not None and base is None:
            bases[side] = (position, raw)
        use = base if raw is not None and base is not None else None
        rows.append({
            "candidate_id": candidate_id, "position": position, "task_id": _text(ep.task_id) or "",
            "side": side, "repeat": int(ep.repeat or 0), "score": _number(ep.score), "grader": _text(ep.grader) or "",
            "latency_ms": _number(ep.latency_ms), "error": _text(ep.error), "answer": _text(ep.answer),
            "request": None if raw is None else _compress(raw, use[1] if use else None),
            "request_base": use[0] if use else None,
        })
    return rows


def _as_dict(row: Any, request: Any) -> dict[str, Any]:
    return {"position": row.position, "task_id": row.task_id, "side": row.side, "repeat": row.repeat,
            "score": row.score, "grader": row.grader, "latency_ms": row.latency_ms, "error": row.error,
            "answer": row.answer, "request": request}


class EpisodeStore:
    """The episode methods of ``RecordStore`` (which provides the engines)."""

    def add_episodes(self, candidate_id: str, episodes: Sequence[Any], *, conn: Connection | None = None) -> int:
        """Store ``episodes`` of ``candidate_id`` (inside ``conn``'s transaction when given)."""
        rows = episode_rows(candidate_id, episodes)
        if not rows:
            return 0
        if conn is not None:
            conn.execute(insert(EpisodeRow.__table__), rows)
        else:
            with self._writer.begin() as c:
                c.execute(insert(EpisodeRow.__table__), rows)
        return len(rows)

    def list_episodes(self, candidate_id: str, *, after: int | None = None,
                      limit: int | None = None) -> list[dict[str, Any]]:
        """Episodes of ``candidate_id`` in evaluation order (positions after ``after``), each
        with its request decoded."""
        q = select(EpisodeRow.__table__).where(EpisodeRow.candidate_id == candidate_id)
        if after is not None:
            q = q.where(EpisodeRow.position > after)
        q = q.order_by(EpisodeRow.position)
        if limit is not None:
            q = q.limit(limit)
        with self._reader.connect() as conn:
            rows = list(conn.execute(q))
            have = {r.position: r for r in rows}
            wanted = {r.request_base for r in rows if r.request_base is not None} - set(have)
            if wanted:
                base_q = select(EpisodeRow.position, EpisodeRow.request).where(
                    EpisodeRow.candidate_id == candidate_id, EpisodeRow.position.in_(wanted))
                have.update({r.position: r for r in conn.execute(base_q)})
        dictionaries = {pos: _decompress(have[pos].request, None) for pos in
                        {r.request_base for r in rows if r.request_base is not None}}
        out = []
        for r in rows:
            if r.request is None:
                request = None
            else:
                request = json.loads(_decompress(r.request, dictionaries.get(r.request_base)))
            out.append(_as_dict(r, request))
        return out

    def episode_counts(self, candidate_ids: Iterable[str]) -> dict[str, int]:
        """{candidate id: stored episodes} of those of ``candidate_ids`` with any."""
        ids = list(candidate_ids)
        if not ids:
            return {}
        q = (select(EpisodeRow.candidate_id, func.count()).where(EpisodeRow.candidate_id.in_(ids))
             .group_by(EpisodeRow.candidate_id))
        with self._reader.connect() as conn:
            return {cid: n for cid, n in conn.execute(q)}

    def remove_episodes(self, created_before: datetime) -> dict[str, int]:
        """Delete the episodes of candidates created before ``created_before`` (their summary
        evaluation stays on the candidate); {scenario: episodes removed}."""
        old = select(CandidateRow.id).where(CandidateRow.created_at < created_before)
        counted = (select(CandidateRow.scenario, func.count())
                   .join(EpisodeRow, EpisodeRow.candidate_id == CandidateRow.id)
                   .where(CandidateRow.created_at < created_before).group_by(CandidateRow.scenario))
        with self._writer.begin() as conn:
            removed = {scenario: n for scenario, n in conn.execute(counted)}
            if removed:
                conn.execute(delete(EpisodeRow).where(EpisodeRow.candidate_id.in_(old)))
        return removed
