"""The record store: records, reports, consumption, candidates, episodes and releases.

Every method is one transaction. Writes are durable when the method returns (SQLite WAL
with ``synchronous=FULL``; PostgreSQL commit). Methods are synchronous; the server calls
them from a thread (see ``reef_core.serve``), never on the event loop.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, exists, func, insert, union
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from ..errors import ConflictError, NotFoundError
from .consumption import ConsumptionStore, PoolRule, back_in_pool, newest_seq
from .engine import make_engines, normalize_url, open_store
from .episodes import EpisodeStore
from .ids import receipt_shaped
from .leases import LeaseStore
from .models import CandidateRow, Consumption, Record, Release, Report, ReportReference, storable, utcnow
from .modes import ModeStore
from .record_insert import SQLiteRecordInsert
from .record_pages import RecordPages
from .retention import RetentionStore

_RECORD_COLUMNS = tuple(c.name for c in Record.__table__.columns if c.name != "seq")
_INSERT_RECORD = insert(Record.__table__)


class ScenarioMismatch(ConflictError):
    """A report quotes a receipt that belongs to another scenario."""

    def __init__(self, message: str, *, receipt: str = "", record_scenario: str = ""):
        super().__init__(message)
        self.receipt = receipt
        self.record_scenario = record_scenario


class RecordStore(RecordPages, ConsumptionStore, EpisodeStore, LeaseStore, ModeStore, RetentionStore):
    """Typed access to Reef's tables. Safe to share between threads."""

    def __init__(self, url: str, *, migrate: bool = True, synchronous: str = "full"):
        self.url = normalize_url(url)
        self._writer, self._reader = make_engines(self.url, synchronous=synchronous)
        try:
            open_store(self._writer, migrate=migrate)
        except BaseException:
            self.close()
            raise
        #: SQLite's record insert on the driver connection (``record_insert``); None elsewhere
        self._insert_records = SQLiteRecordInsert(self._writer, _RECORD_COLUMNS) \
            if self._writer.dialect.name == "sqlite" else None

    @property
    def dialect(self) -> str:
        return self._writer.dialect.name

    def close(self) -> None:
        self._writer.dispose()
        if self._reader is not self._writer:
            self._reader.dispose()

    def _write(self) -> Session:
        return Session(self._writer, expire_on_commit=False)

    def _read(self) -> Session:
        return Session(self._reader, expire_on_commit=False)

    # ------------------------------------------------------------------ records

    def add_records(self, records: Sequence[Record]) -> None:
        """Store several records in one transaction (the group-commit path).

        A Core ``INSERT`` rather than the ORM's unit of work: on the serving hot path the ORM
        costs about 0.2 ms of CPU more per record. The records' ``seq`` is not filled in;
        read a record back to learn it.
        """
        if not records:
            return
        if self._insert_records is not None:
            self._insert_records(records)
            return
        rows = [{name: getattr(r, name) for name in _RECORD_COLUMNS} for r in records]
        with self._writer.begin() as conn:
            conn.execute(_INSERT_RECORD, rows)

    def add_record(self, record: Record) -> Record:
        self.add_records([record])
        return record

    def get_record(self, record_id: str) -> Record | None:
        if not storable(record_id):
            return None
        with self._read() as s:
            return s.exec(select(Record).where(Record.id == record_id)).first()

    def get_records(self, ids: Iterable[str]) -> dict[str, Record]:
        ids = [i for i in ids if storable(i)]
        if not ids:
            return {}
        with self._read() as s:
            rows = s.exec(select(Record).where(Record.id.in_(ids))).all()
        return {r.id: r for r in rows}

    def scenario_names(self) -> list[str]:
        """Every scenario with stored data (records, reports or releases), sorted; one query."""
        q = union(select(Record.scenario), select(Report.scenario), select(Release.scenario))
        with self._reader.connect() as conn:
            return sorted(conn.execute(q).scalars())

    def scenarios_with_pending_reports(self) -> list[str]:
        """Scenarios holding a report no candidate consumed yet or one a candidate returned (the
        only ones a growth step can find experience in), sorted; one query."""
        pending = ~exists().where(Consumption.item_id == Report.id, Consumption.state != "returned")
        with self._read() as s:
            return sorted(s.exec(select(Report.scenario).where(pending).distinct()).all())

    def counts(self, scenario: str) -> dict[str, Any]:
        """Record counts by status, report count and consumption for one scenario: consumed
        items are held or spent; returned reports wait for the return rule; exhausted reports
        were attempted ``loop.max_attempts`` times and stay consumed."""
        with self._read() as s:
            by_status = dict(
                s.exec(
                    select(Record.status, func.count()).where(Record.scenario == scenario).group_by(Record.status)
                ).all()
            )
            reports = s.exec(select(func.count()).select_from(Report).where(Report.scenario == scenario)).one()
            states = s.exec(
                select(Consumption.item_kind, Consumption.state, func.count())
                .where(Consumption.scenario == scenario)
                .group_by(Consumption.item_kind, Consumption.state)
            ).all()
        consumed = {(kind, state): n for kind, state, n in states}
        return {
            "records": sum(by_status.values()),
            "records_by_status": by_status,
            "reports": reports,
            "consumed_records": consumed.get(("record", "held"), 0) + consumed.get(("record", "spent"), 0),
            "consumed_reports": consumed.get(("report", "held"), 0) + consumed.get(("report", "spent"), 0),
            "returned_reports": consumed.get(("report", "returned"), 0),
            "exhausted_reports": consumed.get(("report", "spent"), 0),
        }

    # ------------------------------------------------------------------ reports

    @staticmethod
    def report_body_hash(body: dict[str, Any]) -> str:
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def add_report(self, report: Report) -> tuple[Report, bool]:
        """Store ``report`` after checking its references; return (stored report, created).

        Same id and same body: the stored report, created=False (an idempotent retry).
        Same id, other body: ConflictError. A reference that is not a stored record of this
        scenario: NotFoundError / ScenarioMismatch naming it. An id with a receipt's shape
        (``rec_`` and 32 hex digits): ConflictError. Nothing is written on error.
        """
        if receipt_shaped(report.id):
            # consumption keys records and reports by id alike: a report named after a record
            # would hold that record while it is consumed (and for good once published), so
            # the reports that quote the record would never train
            raise ConflictError(f"report_id {report.id!r} has the shape of a receipt (a record's id); "
                                f"choose another")
        refs = list(report.references or [])
        if len(set(refs)) != len(refs):
            dup = next(r for r in refs if refs.count(r) > 1)
            raise ConflictError(f"reference {dup!r} appears more than once in references")
        existing = self.get_report(report.id)
        if existing is not None:
            return self._same_report(existing, report), False
        records = self.get_records(refs)
        for ref in refs:
            rec = records.get(ref)
            if rec is None:
                raise NotFoundError(f"no record with receipt {ref!r}")
            if rec.scenario != report.scenario:
                raise ScenarioMismatch(
                    f"receipt {ref!r} belongs to scenario {rec.scenario!r}, not {report.scenario!r}",
                    receipt=ref, record_scenario=rec.scenario,
                )
        try:
            with self._write() as s:
                s.add(report)
                for pos, ref in enumerate(refs):
                    s.add(ReportReference(report_id=report.id, position=pos, record_id=ref))
                s.commit()
        except IntegrityError:
            # A concurrent retry with the same id won the race: answer as a retry would.
            existing = self.get_report(report.id)
            if existing is None:
                raise
            return self._same_report(existing, report), False
        return report, True

    @staticmethod
    def _same_report(existing: Report, new: Report) -> Report:
        if existing.body_hash != new.body_hash or existing.scenario != new.scenario:
            raise ConflictError(f"report_id {new.id!r} was already used for a different report")
        return existing

    def get_report(self, report_id: str) -> Report | None:
        if not storable(report_id):
            return None
        with self._read() as s:
            return s.exec(select(Report).where(Report.id == report_id)).first()

    def reports_for_records(self, record_ids: Iterable[str]) -> dict[str, list[Report]]:
        """Reports quoting each of ``record_ids``, oldest first."""
        ids = list(record_ids)
        out: dict[str, list[Report]] = {i: [] for i in ids}
        if not ids:
            return out
        with self._read() as s:
            rows = s.exec(
                select(ReportReference.record_id, Report)
                .join(Report, Report.id == ReportReference.report_id)
                .where(ReportReference.record_id.in_(ids))
                .order_by(Report.seq)
            ).all()
        for record_id, report in rows:
            out[record_id].append(report)
        return out

    def records_with_report_score(self, record_ids: Iterable[str], lo: float | None, hi: float | None) -> set[str]:
        """Those of ``record_ids`` quoted by a report scored within ``[lo, hi]`` (None: unbounded)."""
        ids = [i for i in record_ids if storable(i)]
        if not ids:
            return set()
        conditions = [ReportReference.record_id.in_(ids), Report.score.is_not(None)]
        if lo is not None:
            conditions.append(Report.score >= lo)
        if hi is not None:
            conditions.append(Report.score <= hi)
        q = (select(ReportReference.record_id).distinct()
             .join(Report, Report.id == ReportReference.report_id).where(*conditions))
        with self._reader.connect() as conn:
            return set(conn.execute(q).scalars())

    def scored_report_points(self, scenario: str, *, limit: int) -> list[tuple[Any, float, str]]:
        """``(created_at, score, first receipt)`` of ``scenario``'s newest ``limit`` reports with a
        score, oldest first: three columns, no feedback or metadata read (the learning curve)."""
        q = (select(Report.created_at, Report.score, ReportReference.record_id)
             .join(ReportReference, and_(ReportReference.report_id == Report.id, ReportReference.position == 0))
             .where(Report.scenario == scenario, Report.score.is_not(None))
             .order_by(Report.seq.desc()).limit(limit))
        with self._reader.connect() as conn:
            rows = conn.execute(q).all()
        return [(created, float(score), ref) for created, score, ref in reversed(rows)]

    def list_reports(self, scenario: str, *, after_seq: int | None = None, limit: int | None = None,
                     unconsumed_only: bool = False, pool: PoolRule | None = None,
                     newest_first: bool = False) -> list[Report]:
        """Reports of ``scenario`` by seq (``newest_first``: the newest ``limit``, newest first):
        all, those no candidate consumed (``unconsumed_only``), or those in the pool under
        ``pool`` (never consumed, or returned and back by the rule, and within the retention
        horizon)."""
        q = select(Report).where(*self._report_conditions(scenario, after_seq, unconsumed_only, pool))
        q = q.order_by(Report.seq.desc() if newest_first else Report.seq)
        if limit is not None:
            q = q.limit(limit)
        with self._read() as s:
            return list(s.exec(q).all())

    def pool_reports_page(self, scenario: str, pool: PoolRule, *, after_seq: int | None, limit: int,
                          max_bytes: int) -> tuple[list[Report], bool]:
        """The next reports of ``scenario``'s pool under ``pool`` (oldest first, after ``after_seq``):
        at most ``limit`` of them and ``max_bytes`` of their bodies (feedback, references,
        metadata; the database measures them first; at least one), and whether more follow.
        Any client with a report token sends bodies of megabytes: a page of 500 must not hold them all."""
        from .record_pages import _fit, _report_bytes

        conditions = self._report_conditions(scenario, after_seq, False, pool)
        sizes_q = select(Report.seq, _report_bytes(self.dialect)).where(*conditions).order_by(Report.seq)
        with self._read() as s:
            sizes = list(s.exec(sizes_q.limit(limit + 1)).all())
            chosen = _fit(sizes[:limit], max_bytes)
            rows = list(s.exec(select(Report).where(Report.seq.in_(chosen)).order_by(Report.seq)).all()) \
                if chosen else []
        return rows, len(sizes) > len(chosen)

    @staticmethod
    def _report_conditions(scenario: str, after_seq: int | None, unconsumed_only: bool,
                           pool: PoolRule | None) -> list[Any]:
        conditions = [Report.scenario == scenario]
        if after_seq is not None:
            conditions.append(Report.seq > after_seq)
        if unconsumed_only:
            conditions.append(~Report.id.in_(select(Consumption.item_id)))
        if pool is not None:
            conditions.append(~exists().where(Consumption.item_id == Report.id, ~back_in_pool(scenario, pool)))
            if pool.max_age_days is not None:
                conditions.append(Report.created_at >= utcnow() - timedelta(days=pool.max_age_days))
            if pool.max_reports is not None:
                conditions.append(Report.seq >= func.coalesce(newest_seq(scenario, pool.max_reports), 0))
        return conditions

    # ------------------------------------------------------------------ candidates

    def add_candidate(self, row: CandidateRow) -> CandidateRow:
        with self._write() as s:
            s.add(row)
            s.commit()
        return row

    def update_candidate(self, candidate_id: str, *, episodes: Sequence[Any] = (),
                         return_experience: int | None = None, **fields: Any) -> CandidateRow:
        """Set ``fields`` of a candidate; in the same transaction store its evaluation
        ``episodes`` (``reef_core.types.Episode``) and, with ``return_experience`` (the
        ``loop.max_attempts`` in force), return the experience it holds to the pool."""
        with self._write() as s:
            row = s.exec(select(CandidateRow).where(CandidateRow.id == candidate_id)).first()
            if row is None:
                raise NotFoundError(f"no candidate {candidate_id!r}")
            for k, v in fields.items():
                setattr(row, k, v)
            if "decision" in fields and row.decided_at is None:
                row.decided_at = utcnow()
            s.add(row)
            if episodes or return_experience is not None:
                s.flush()
                conn = s.connection()
                if episodes:
                    self.add_episodes(candidate_id, episodes, conn=conn)
                if return_experience is not None:
                    self._return_experience(conn, row, return_experience)
            s.commit()
            return row

    def get_candidate(self, candidate_id: str) -> CandidateRow | None:
        if not storable(candidate_id):
            return None
        with self._read() as s:
            return s.exec(select(CandidateRow).where(CandidateRow.id == candidate_id)).first()

    def candidates_with_status(self, statuses: Iterable[str]) -> list[CandidateRow]:
        """Candidates of every scenario whose status is one of ``statuses``, oldest first."""
        statuses = list(statuses)
        if not statuses:
            return []
        with self._read() as s:
            return list(s.exec(select(CandidateRow).where(CandidateRow.status.in_(statuses))
                               .order_by(CandidateRow.seq)).all())

    def decided_candidate(self, scenario: str, content_hash: str, base_release_id: str | None) -> CandidateRow | None:
        """The newest candidate of ``scenario`` whose artifact has ``content_hash`` and that the
        gate rejected or left undecided against the serving release ``base_release_id`` (None:
        the base model); None when the gate never decided that artifact against it."""
        artifact_hash = CandidateRow.__table__.c.artifact["content_hash"].as_string()
        base = CandidateRow.base_release_id
        q = (select(CandidateRow)
             .where(CandidateRow.scenario == scenario, CandidateRow.decision.in_(("reject", "undecided")),
                    base == base_release_id if base_release_id is not None else base.is_(None),
                    artifact_hash == content_hash)
             .order_by(CandidateRow.seq.desc()).limit(1))
        with self._read() as s:
            return s.exec(q).first()

    def list_candidates(self, scenario: str, *, status: str | None = None,
                        limit: int | None = None) -> list[CandidateRow]:
        q = select(CandidateRow).where(CandidateRow.scenario == scenario)
        if status:
            q = q.where(CandidateRow.status == status)
        q = q.order_by(CandidateRow.seq.desc())
        if limit is not None:
            q = q.limit(limit)
        with self._read() as s:
            return list(s.exec(q).all())

    # ------------------------------------------------------------------ releases

    def add_release(self, row: Release) -> Release:
        """Append a release; ConflictError when its (scenario, sequence) slot is taken."""
        try:
            with self._write() as s:
                s.add(row)
                s.commit()
        except IntegrityError:
            raise ConflictError(
                f"release {row.sequence} of scenario {row.scenario!r} already exists"
            ) from None
        return row

    def head_release(self, scenario: str) -> Release | None:
        with self._read() as s:
            return s.exec(
                select(Release).where(Release.scenario == scenario).order_by(Release.sequence.desc()).limit(1)
            ).first()

    def head_releases(self, scenarios: Iterable[str] | None = None) -> dict[str, Release]:
        """{scenario: head release} of every scenario with a release (or of those of
        ``scenarios`` that have one), in one query."""
        newest = select(Release.scenario, func.max(Release.sequence).label("sequence")).group_by(Release.scenario)
        if scenarios is not None:
            names = list(scenarios)
            if not names:
                return {}
            newest = newest.where(Release.scenario.in_(names))
        newest = newest.subquery()
        q = select(Release).join(newest, and_(Release.scenario == newest.c.scenario,
                                              Release.sequence == newest.c.sequence))
        with self._read() as s:
            return {row.scenario: row for row in s.exec(q).all()}

    def release_counts(self) -> dict[str, int]:
        """{scenario: number of releases} of every scenario with a release, in one query."""
        with self._read() as s:
            return dict(s.exec(select(Release.scenario, func.count()).group_by(Release.scenario)).all())

    def releases_of_candidates(self, candidate_ids: Iterable[str]) -> dict[str, str]:
        """{candidate id: release id} of those of ``candidate_ids`` that were published."""
        ids = list(candidate_ids)
        if not ids:
            return {}
        with self._read() as s:
            rows = s.exec(select(Release.candidate_id, Release.release_id).where(Release.candidate_id.in_(ids))).all()
        return dict(rows)

    def get_release(self, release_id: str) -> Release | None:
        with self._read() as s:
            return s.exec(select(Release).where(Release.release_id == release_id)).first()

    def list_releases(self, scenario: str, *, newest_first: bool = True) -> list[Release]:
        order = Release.sequence.desc() if newest_first else Release.sequence
        with self._read() as s:
            return list(s.exec(select(Release).where(Release.scenario == scenario).order_by(order)).all())
