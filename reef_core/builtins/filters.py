"""The standard record filters: scored, score window, dedup, freshness, session assembly.

Each filter takes the scenario's candidate experiences (oldest first) and returns those it
keeps; ``session`` enriches instead of narrowing. A recipe names the filters it needs in
``filters``; ``scenarios.<name>.filters`` adds more. See docs/learning.md.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..contracts import RecordFilter
from ..hookspecs import hookimpl
from ..observe import Experience, ExperienceRecord

if TYPE_CHECKING:  # eligibility reads the store, which loading the built-in plugins must not import
    from ..observe import FilterContext


class ScoredFilter(RecordFilter):
    """Keeps experiences whose report carries a finite numeric score."""

    def apply(self, items: list[Experience], ctx: FilterContext) -> list[Experience]:
        return [e for e in items if e.score is not None and math.isfinite(e.score)]


class ScoreWindowFilter(RecordFilter):
    """Keeps experiences scored within ``[min, max]`` (either bound optional, both inclusive).

    Unscored experiences are dropped whenever a bound is set.
    """

    def __init__(self, min: float | None = None, max: float | None = None):
        if min is not None and max is not None and min > max:
            raise ValueError(f"score_window min ({min}) is above max ({max})")
        self.min = min
        self.max = max

    def apply(self, items: list[Experience], ctx: FilterContext) -> list[Experience]:
        if self.min is None and self.max is None:
            return items
        return [e for e in items if e.score is not None
                and (self.min is None or e.score >= self.min)
                and (self.max is None or e.score <= self.max)]


class DedupFilter(RecordFilter):
    """Drops experiences whose records repeat content seen earlier in the pool or already
    consumed by a candidate (content hash of request + response)."""

    def apply(self, items: list[Experience], ctx: FilterContext) -> list[Experience]:
        keys = [tuple(r.content_key for r in e.records) for e in items]
        stored = {r.content_hash for e in items for r in e.records if r.content_hash}
        consumed = ctx.store.consumed_content_hashes(ctx.scenario, stored) if stored else set()
        seen: set[tuple[str, ...]] = set()
        kept = []
        for e, key in zip(items, keys):
            if key in seen or (key and all(k in consumed for k in key)):
                continue
            seen.add(key)
            kept.append(e)
        return kept


class FreshnessFilter(RecordFilter):
    """Keeps experiences whose every record was served at most ``max_behind`` releases behind
    the scenario's head (0: only records served by the head itself)."""

    def __init__(self, max_behind: int = 1):
        if max_behind < 0:
            raise ValueError("freshness max_behind must be 0 or more")
        self.max_behind = max_behind

    def apply(self, items: list[Experience], ctx: FilterContext) -> list[Experience]:
        return [e for e in items
                if all(ctx.releases_behind(r.release_id) <= self.max_behind for r in e.records)]


class SessionFilter(RecordFilter):
    """Assembles sessions: attaches the other turns of each experience's ``x-reef-session``
    (oldest first) as ``session_records``. Context only: they are not consumed.

    With ``require: true`` experiences without a session are dropped.
    """

    def __init__(self, require: bool = False, max_turns: int = 200):
        self.require = require
        self.max_turns = max_turns

    def apply(self, items: list[Experience], ctx: FilterContext) -> list[Experience]:
        out = []
        cache: dict[str, tuple[ExperienceRecord, ...]] = {}
        for e in items:
            session = e.session
            if session is None:
                if not self.require:
                    out.append(e)
                continue
            if session not in cache:
                rows = ctx.store.list_records(ctx.scenario, session=session, limit=self.max_turns)
                cache[session] = tuple(ExperienceRecord.from_row(r) for r in rows)
            own = set(e.record_ids)
            out.append(replace(e, session_records=tuple(r for r in cache[session] if r.id not in own)))
        return out


@hookimpl
def register_record_filters(register: Any) -> None:
    register("scored", ScoredFilter)
    register("score_window", ScoreWindowFilter)
    register("dedup", DedupFilter)
    register("freshness", FreshnessFilter)
    register("session", SessionFilter)
