"""Which experience a scenario may learn from: the pool, its records, the filters.

The pool is every report of the scenario that is in the pool and whose quoted records are in
the pool too, oldest first: never consumed, or returned by a rejected (or undecided, errored,
interrupted, conflicting) candidate and back under the return rule (``PoolRule``: the serving release
moved on, or enough new reports arrived; at most ``loop.max_attempts`` attempts). The
recipe's filters run first, then the filters the scenario config adds; each filter narrows
(or enriches) the list. Filters are plugins (``register_record_filters``); their protocol is
``apply(items, ctx) -> items``.

A scenario's learning mode bounds the pool too (``docs/modes.md``): in ``record_only`` it is
empty, and once the scenario leaves ``record_only`` it starts at that moment: records and
reports stored up to then never become experience (``RecordStore.pool_start``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..store import PoolRule
from .experience import Experience, ExperienceRecord

log = logging.getLogger("reef.observe")

#: unconsumed reports read per page while looking for eligible experience
PAGE_SIZE = 500
#: bytes of report bodies a page of the pool holds at most (about: one larger report is a page of its own)
PAGE_BYTES = 16 * 1024 * 1024


def pool_rule(loop: Any, batch_size: int | None) -> PoolRule:
    """The pool rule of a scenario from the ``loop`` settings and its recipe's ``batch_size``
    (``loop.retry_after_new`` defaults to it, at least 1)."""
    retry = loop.retry_after_new if loop.retry_after_new is not None else max(int(batch_size or 0), 1)
    return PoolRule(retry_after_new=retry, max_attempts=loop.max_attempts,
                    max_age_days=loop.retention.max_age_days, max_reports=loop.retention.max_reports)


@dataclass
class FilterContext:
    """What a record filter may consult besides the items themselves."""

    scenario: str
    store: Any
    #: release id -> sequence number in the scenario's chain (absent: unknown / no release)
    release_sequences: dict[str, int] = field(default_factory=dict)
    head_sequence: int = 0

    def releases_behind(self, release_id: str | None) -> int:
        """How many releases behind the head ``release_id`` is (no release: the whole chain)."""
        seq = self.release_sequences.get(release_id or "", 0)
        return max(self.head_sequence - seq, 0)


FilterSpec = Any  # "name" | (name, {options}) | {"name": name, **options}


def parse_filter_spec(spec: FilterSpec) -> tuple[str, dict[str, Any]]:
    """Normalise one filter declaration to (name, options)."""
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], str):
        return spec[0], dict(spec[1] or {})
    if isinstance(spec, dict) and isinstance(spec.get("name"), str):
        options = dict(spec)
        return options.pop("name"), options
    raise ConfigError(f"invalid record filter declaration {spec!r}: use a name, "
                      "(name, options) or {{name: ..., option: ...}}")


def build_filters(specs: Iterable[FilterSpec], build: Callable[[str, str, dict[str, Any]], Any]) -> list[tuple[str, Any]]:
    """Instantiate filters in order with ``build(kind, name, options)`` (``Reef.build``); a
    name declared twice keeps its first declaration."""
    built: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for spec in specs:
        name, options = parse_filter_spec(spec)
        if name in seen:
            continue
        seen.add(name)
        built.append((name, build("record_filter", name, options)))
    return built


def load_page(store: Any, scenario: str, *, after_seq: int | None = None, limit: int | None = None,
              rule: PoolRule | None = None) -> tuple[list[Experience], int | None]:
    """One page of the pool: (experiences, cursor for the next page or None at the end).

    The pool is every report of ``scenario`` in the pool under ``rule`` (default
    ``PoolRule()``) whose quoted records are all in it too, oldest first. Three queries per
    page, whatever its size: the reports, their records, and which records are out.
    """
    limit = limit or PAGE_SIZE
    rule = rule or PoolRule()
    start = store.pool_start(scenario)
    if start.closed:
        return [], None
    if start.after_report_seq is not None:
        after_seq = max(after_seq or 0, start.after_report_seq)
    # at most PAGE_BYTES of report bodies a page, whatever reporters sent
    reports, more = store.pool_reports_page(scenario, rule, after_seq=after_seq, limit=limit, max_bytes=PAGE_BYTES)
    if not reports:
        return [], None
    ref_ids = list(dict.fromkeys(r for rep in reports for r in (rep.references or [])))
    records = store.get_records(ref_ids)
    out = store.outside_pool(scenario, ref_ids, rule)
    page: list[Experience] = []
    for rep in reports:
        refs = list(rep.references or [])
        if any(r in out or r not in records or not start.admits_record(records[r].seq) for r in refs):
            continue
        page.append(Experience(
            report_id=rep.id, scenario=rep.scenario, score=rep.score, feedback=rep.feedback,
            metadata=dict(rep.meta or {}), created_at=rep.created_at, report_seq=rep.seq,
            records=tuple(ExperienceRecord.from_row(records[r]) for r in refs),
        ))
    return page, (reports[-1].seq if more else None)


def load_pool(store: Any, scenario: str, rule: PoolRule | None = None) -> list[Experience]:
    """The whole pool of ``scenario``, oldest first (every page)."""
    pool: list[Experience] = []
    cursor: int | None = None
    while True:
        page, cursor = load_page(store, scenario, after_seq=cursor, rule=rule)
        pool += page
        if cursor is None:
            return pool


def filter_context(store: Any, scenario: str) -> FilterContext:
    releases = store.list_releases(scenario, newest_first=False)
    return FilterContext(
        scenario=scenario, store=store,
        release_sequences={r.release_id: r.sequence for r in releases},
        head_sequence=releases[-1].sequence if releases else 0,
    )


def eligible(store: Any, scenario: str, filters: Sequence[tuple[str, Any]], *,
             want: int | None = None, rule: PoolRule | None = None) -> list[Experience]:
    """The scenario's eligible experiences after every filter, oldest first.

    Pages through the pool and stops once ``want`` are found (None: reads it all), so reports
    that never become eligible (say, well-scored ones under ``score_window``) can pile up
    without hiding newer eligible ones. Filters see the experiences kept so far plus each new
    page, so ``dedup`` compares across pages.
    """
    ctx = filter_context(store, scenario)
    kept: list[Experience] = []
    cursor: int | None = None
    while True:
        page, cursor = load_page(store, scenario, after_seq=cursor, rule=rule)
        if page:
            kept = _apply(filters, kept + page, ctx)
        if cursor is None or (want is not None and len(kept) >= want):
            return kept


def _apply(filters: Sequence[tuple[str, Any]], items: list[Experience], ctx: FilterContext) -> list[Experience]:
    for name, flt in filters:
        before = len(items)
        items = list(flt.apply(items, ctx))
        if len(items) != before:
            log.debug("filter %s kept %d of %d experiences of %s", name, len(items), before, ctx.scenario)
        if not items:
            break
    return items
