"""Retention: removing reports that can never become eligible, and the records only they quote.

A report can never become eligible when it was attempted ``loop.max_attempts`` times
(``spent``), or when it fell behind the scenario's retention horizon (older than
``max_age_days``, or older than the newest ``max_reports``). What stays whatever its age:
experience a published candidate consumed (a release's attribution) and experience a
candidate holds while it runs. A record goes with the last report quoting it, unless a
candidate that must be kept consumed it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, case, delete, exists, func, or_, select

from .consumption import newest_seq
from .models import CandidateRow, Consumption, Record, Report, ReportReference, utcnow

#: reports removed per transaction
CHUNK = 500
#: candidates whose consumption keeps nothing: it trained nothing that serves, and never will
_SETTLED = ("skipped", "conflict")


def _kept_by_a_candidate(item_id) -> object:
    """SQL: a candidate that must be kept holds ``item_id`` (published, running, or unknown)."""
    settled = exists().where(CandidateRow.id == Consumption.candidate_id, CandidateRow.status.in_(_SETTLED))
    return exists().where(Consumption.item_id == item_id, Consumption.state == "held", ~settled)


class RetentionStore:
    """The retention methods of ``RecordStore`` (which provides the engines)."""

    def retention_scenarios(self, *, max_age_days: float | None = None, max_reports: int | None = None,
                            now: datetime | None = None) -> list[str]:
        """The scenarios where ``apply_retention`` may find something to remove (spent reports,
        reports older than ``max_age_days``, more reports than ``max_reports``), sorted; one
        query, so idle scenarios cost nothing."""
        if max_age_days is None and max_reports is None:
            return []
        gone = exists().where(Consumption.item_id == Report.id, Consumption.state == "spent")
        if max_age_days is not None:
            gone = or_(gone, Report.created_at < (now or utcnow()) - timedelta(days=max_age_days))
        some_gone = func.max(case((gone, 1), else_=0)) == 1
        if max_reports is not None:
            some_gone = or_(some_gone, func.count() > max_reports)
        q = select(Report.scenario).group_by(Report.scenario).having(some_gone)
        with self._reader.connect() as conn:
            return sorted(conn.execute(q).scalars())

    def apply_retention(self, scenario: str, *, max_age_days: float | None = None,
                        max_reports: int | None = None, now: datetime | None = None) -> dict[str, int]:
        """Remove ``scenario``'s reports that can never become eligible, and the records only
        they quote; {"reports": n, "records": n} removed. Nothing happens without a limit: both
        None keep everything (spent reports included)."""
        removed = {"reports": 0, "records": 0}
        if max_age_days is None and max_reports is None:
            return removed
        gone = [exists().where(Consumption.item_id == Report.id, Consumption.state == "spent")]
        if max_age_days is not None:
            gone.append(Report.created_at < (now or utcnow()) - timedelta(days=max_age_days))
        if max_reports is not None:
            gone.append(Report.seq < func.coalesce(newest_seq(scenario, max_reports), 0))
        pick = (select(Report.id).where(Report.scenario == scenario, or_(*gone), ~_kept_by_a_candidate(Report.id))
                .order_by(Report.seq).limit(CHUNK))
        while True:
            with self._writer.begin() as conn:
                reports = list(conn.execute(pick).scalars())
                if not reports:
                    return removed
                quoted = set(conn.execute(select(ReportReference.record_id).where(
                    ReportReference.report_id.in_(reports))).scalars())
                keep = set(conn.execute(select(ReportReference.record_id).where(
                    ReportReference.record_id.in_(quoted), ReportReference.report_id.not_in(reports))).scalars())
                keep |= set(conn.execute(select(Record.id).where(
                    Record.id.in_(quoted - keep), _kept_by_a_candidate(Record.id))).scalars())
                records = sorted(quoted - keep)
                conn.execute(delete(ReportReference).where(ReportReference.report_id.in_(reports)))
                conn.execute(delete(Report).where(Report.id.in_(reports)))
                conn.execute(delete(Consumption).where(Consumption.item_id.in_(reports + records)))
                if records:
                    conn.execute(delete(Record).where(and_(Record.id.in_(records), Record.scenario == scenario)))
            removed["reports"] += len(reports)
            removed["records"] += len(records)
