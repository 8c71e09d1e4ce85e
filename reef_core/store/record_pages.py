"""Reading a scenario's records: pages bounded in bytes as well as in rows, and reads of a few columns.

A record's bodies (request, response, token ids, logprobs) can be megabytes each, so a page
of 500 records, or an export of a whole scenario, must not hold them all at once (a chain of
Responses turns once took a reader to 1.86 GB). A page is a keyset page on ``seq`` read in two
queries: first the size of each next row's bodies, computed by the database (no body leaves
it), then the bodies of as many of those rows as fit in ``max_bytes`` (always at least one).
Readers that need no bodies read the columns they use and nothing else.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import reduce
from typing import Any

from sqlalchemy import LargeBinary, Text, cast, func
from sqlalchemy.orm import defer
from sqlmodel import select

from .models import Record, storable

#: bytes of bodies a page holds by default (about: one record larger than this is a page of its own)
PAGE_BYTES = 16 * 1024 * 1024
#: rows a page holds at most
PAGE_ROWS = 500
#: the columns whose size grows with the conversation (what a page's byte bound counts)
BODY_COLUMNS = ("request", "response", "prompt_token_ids", "response_token_ids", "logprobs", "top_logprobs",
                "error")


@dataclass(frozen=True)
class StoredResponse:
    """What ``GET /v1/responses/{id}`` needs of a record: not the request's body, only its ``store``."""

    id: str
    scenario: str
    route: str | None
    response: Any
    unstored: bool  # the request said ``store: false`` (the answer is not to be retrieved)


def _stored_bytes(column: Any, dialect: str) -> Any:
    """SQL: the bytes of one column's value as the database stores it (0 for NULL)."""
    size = func.length(cast(column, LargeBinary)) if dialect == "sqlite" else func.octet_length(cast(column, Text))
    return func.coalesce(size, 0)


def _body_bytes(dialect: str) -> Any:
    """SQL: the bytes of a record's bodies, as the database stores them."""
    return reduce(operator.add, (_stored_bytes(Record.__table__.c[name], dialect) for name in BODY_COLUMNS))


def _report_bytes(dialect: str) -> Any:
    """SQL: the bytes of a report's bodies (feedback, references, metadata) as stored."""
    from .models import Report

    return reduce(operator.add, (_stored_bytes(Report.__table__.c[name], dialect)
                                 for name in ("feedback", "references", "metadata")))


def _fit(sizes: list[Any], max_bytes: int) -> list[int]:
    """The seqs of the first rows whose bodies fit in ``max_bytes`` together (at least one)."""
    chosen: list[int] = []
    total = 0
    for seq, size in sizes:
        if chosen and total + size > max_bytes:
            break
        chosen.append(seq)
        total += size
    return chosen


class RecordPages:
    """The record-reading methods of ``RecordStore`` (which provides the engines)."""

    @staticmethod
    def _matching(scenario: str, *, kind: str | None = None, status: str | None = None, session: str | None = None,
                  since: datetime | None = None, until: datetime | None = None, after_seq: int | None = None,
                  before_seq: int | None = None) -> list[Any]:
        """SQL conditions: ``scenario``'s records matching the filters."""
        conditions = [Record.scenario == scenario]
        if kind:
            conditions.append(Record.kind == kind)
        if status:
            conditions.append(Record.status == status)
        if session:
            conditions.append(Record.session == session)
        if since:
            conditions.append(Record.created_at >= since)
        if until:
            conditions.append(Record.created_at < until)
        if after_seq is not None:
            conditions.append(Record.seq > after_seq)
        if before_seq is not None:
            conditions.append(Record.seq < before_seq)
        return conditions

    def list_records(self, scenario: str, *, limit: int | None = 50, newest_first: bool = False,
                     bodies: bool = True, **filters: Any) -> list[Record]:
        """Records of ``scenario`` matching the filters (``kind``, ``status``, ``session``,
        ``since``, ``until``, ``after_seq``, ``before_seq``), ordered by storage sequence: at
        most ``limit`` rows, whatever their size (``records_page`` bounds the bytes too). Without
        ``bodies`` the body columns are not read (reading one raises)."""
        if not all(storable(v) for v in (scenario, filters.get("kind"), filters.get("session")) if v is not None):
            return []  # nothing stored can match a NUL (and PostgreSQL refuses to compare it)
        q = select(Record).where(*self._matching(scenario, **filters))
        q = q.order_by(Record.seq.desc() if newest_first else Record.seq)
        if not bodies:
            q = q.options(*(defer(getattr(Record, name), raiseload=True) for name in BODY_COLUMNS))
        if limit is not None:
            q = q.limit(limit)
        with self._read() as s:
            return list(s.exec(q).all())

    def records_page(self, scenario: str, *, limit: int = PAGE_ROWS, max_bytes: int | None = None,
                     newest_first: bool = False, **filters: Any) -> tuple[list[Record], bool]:
        """One keyset page of ``scenario``'s records matching the filters (as ``list_records``):
        at most ``limit`` rows whose bodies come to at most ``max_bytes`` (default ``PAGE_BYTES``;
        or the first row alone, whatever its size), and whether more rows match after it."""
        if not all(storable(v) for v in (scenario, filters.get("kind"), filters.get("session")) if v is not None):
            return [], False
        order = Record.seq.desc() if newest_first else Record.seq
        sizes_q = select(Record.seq, _body_bytes(self.dialect)).where(*self._matching(scenario, **filters))
        with self._read() as s:
            sizes = list(s.exec(sizes_q.order_by(order).limit(limit + 1)).all())
            chosen = _fit(sizes[:limit], PAGE_BYTES if max_bytes is None else max_bytes)
            rows = list(s.exec(select(Record).where(Record.seq.in_(chosen)).order_by(order)).all()) if chosen else []
        return rows, len(sizes) > len(chosen)

    def iter_record_pages(self, scenario: str, *, limit: int | None = None, max_bytes: int | None = None,
                          page_rows: int = PAGE_ROWS, newest_first: bool = False,
                          **filters: Any) -> Iterator[list[Record]]:
        """``scenario``'s records matching the filters (as ``list_records``), at most ``limit`` of
        them, one ``records_page`` at a time: what a reader of a whole scenario holds is one
        page, not the scenario. Each page is its own read transaction."""
        remaining = limit
        while remaining is None or remaining > 0:
            rows, more = self.records_page(scenario, limit=page_rows if remaining is None else min(page_rows, remaining),
                                           max_bytes=max_bytes, newest_first=newest_first, **filters)
            if not rows:
                return
            yield rows
            if not more:
                return
            filters["before_seq" if newest_first else "after_seq"] = rows[-1].seq
            if remaining is not None:
                remaining -= len(rows)

    def iter_records(self, scenario: str, **options: Any) -> Iterator[Record]:
        """The records of ``iter_record_pages``, one by one."""
        for page in self.iter_record_pages(scenario, **options):
            yield from page

    def bounded_reports_for_records(self, record_ids: Iterable[str], max_bytes: int = PAGE_BYTES,
                                    ) -> tuple[dict[str, list[Any]], dict[str, int]]:
        """Reports quoting each of ``record_ids``, oldest first, as ``reports_for_records`` but at
        most ``max_bytes`` of their bodies in all (the database measures them first; at least one
        report a record), and how many were left out per record: any reporter can quote one receipt
        in many large reports, and a read of the record must stay bounded."""
        from .models import Report, ReportReference

        ids = list(record_ids)
        out: dict[str, list[Any]] = {i: [] for i in ids}
        omitted: dict[str, int] = {}
        if not ids:
            return out, omitted
        sizes_q = (select(ReportReference.record_id, Report.seq, _report_bytes(self.dialect))
                   .join(Report, Report.id == ReportReference.report_id)
                   .where(ReportReference.record_id.in_(ids)).order_by(Report.seq))
        with self._read() as s:
            sizes = list(s.exec(sizes_q).all())
            chosen: set[tuple[str, int]] = set()
            shown: set[str] = set()
            total = 0
            for record_id, seq, size in sizes:
                if total + size <= max_bytes or record_id not in shown:
                    chosen.add((record_id, seq))
                    shown.add(record_id)
                    total += size
                else:
                    omitted[record_id] = omitted.get(record_id, 0) + 1
            seqs = sorted({seq for _, seq in chosen})
            rows = list(s.exec(select(Report).where(Report.seq.in_(seqs)).order_by(Report.seq)).all()) if seqs else []
        by_seq = {r.seq: r for r in rows}
        for record_id, seq, _size in sizes:
            if (record_id, seq) in chosen:
                out[record_id].append(by_seq[seq])
        return out, omitted

    def graded_report_rows(self, scenario: str, *, limit: int, max_meta_bytes: int) -> list[tuple[str, Any, Any]]:
        """``(id, references, metadata)`` of ``scenario``'s newest ``limit`` reports whose metadata
        is at most ``max_meta_bytes`` as stored (measured by the database; feedback never read):
        what the gate's traffic tasks are drawn from, bounded whatever reporters send."""
        from .models import Report

        size = _stored_bytes(Report.__table__.c["metadata"], self.dialect)
        q = (select(Report.id, Report.references, Report.meta)
             .where(Report.scenario == scenario, size <= max_meta_bytes)
             .order_by(Report.seq.desc()).limit(limit))
        with self._read() as s:
            return [tuple(row) for row in s.exec(q).all()]

    def record_release_ids(self, record_ids: Iterable[str]) -> dict[str, str | None]:
        """{record id: the release that served it} of those of ``record_ids`` that are stored
        (two columns read, no bodies)."""
        ids = [i for i in dict.fromkeys(record_ids) if storable(i)]
        out: dict[str, str | None] = {}
        with self._reader.connect() as conn:
            for start in range(0, len(ids), PAGE_ROWS):
                chunk = ids[start:start + PAGE_ROWS]
                q = select(Record.id, Record.release_id).where(Record.id.in_(chunk))
                out.update(dict(conn.execute(q).all()))
        return out

    def stored_response(self, record_id: str) -> StoredResponse | None:
        """The answer of a record and its request's ``store`` field, without the request's body."""
        if not storable(record_id):
            return None
        table = Record.__table__
        if self.dialect == "sqlite":
            unstored = func.json_type(table.c.request, "$.store") == "false"
        else:  # (any request: a ``store`` of another type, or a request that is no object, is no error)
            unstored = cast(table.c.request["store"], Text) == "false"
        q = select(table.c.id, table.c.scenario, table.c.route, table.c.response,
                   func.coalesce(unstored, False)).where(table.c.id == record_id)
        with self._reader.connect() as conn:
            row = conn.execute(q).first()
        return None if row is None else StoredResponse(*row[:4], unstored=bool(row[4]))
