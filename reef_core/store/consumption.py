"""Consumption: which candidate holds which record or report, and when experience returns.

One ``consumption`` row per consumed item (its primary key is the item id), so taking an item
is a compare-and-set: a new row, or a ``returned`` row switched back to ``held``. No record
ever trains two candidates at the same time. What the gate rejected (or left undecided) returns to the pool under
``PoolRule`` (``docs/learning.md``, "Experience that returns").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, func, insert, or_, select, true, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import aliased

from ..errors import ConflictError
from .models import CandidateRow, Consumption, Record, Release, Report, storable, utcnow


@dataclass(frozen=True)
class PoolRule:
    """Which stored reports and records a scenario's pool may hold besides the never-consumed ones.

    Experience a candidate returned (``state='returned'``: the gate rejected it or left it undecided, or errored,
    or the candidate was interrupted) is back in the pool when it was attempted fewer than
    ``max_attempts`` times and either (a) the scenario's head release is not the release the
    candidate was built on, or (b) at least ``retry_after_new`` reports of the scenario were
    stored since it returned (0: at once). Reports older than ``max_age_days`` or older than
    the newest ``max_reports`` of the scenario are out of the pool (retention removes them).
    """

    retry_after_new: int = 1
    max_attempts: int = 3
    max_age_days: float | None = None
    max_reports: int | None = None


def newest_seq(scenario: str, nth: int) -> Any:
    """The seq of the ``nth`` newest report of ``scenario`` (NULL when it has fewer), as SQL (an
    alias of ``reports``, so it never correlates with a query over reports)."""
    report = aliased(Report)
    return (select(report.seq).where(report.scenario == scenario).order_by(report.seq.desc())
            .offset(nth - 1).limit(1).scalar_subquery())


def back_in_pool(scenario: str, rule: PoolRule) -> Any:
    """SQL: the consumption row's item is back in ``scenario``'s pool under ``rule`` (never NULL)."""
    release = aliased(Release)
    head = (select(release.release_id).where(release.scenario == scenario).order_by(release.sequence.desc())
            .limit(1).scalar_subquery())
    moved = Consumption.base_release_id.is_distinct_from(head)
    if rule.retry_after_new <= 0:
        waited = true()
    else:
        nth = newest_seq(scenario, rule.retry_after_new)
        waited = and_(Consumption.returned_after_seq.is_not(None), nth.is_not(None),
                      Consumption.returned_after_seq < nth)
    return and_(Consumption.state == "returned", Consumption.attempts < rule.max_attempts, or_(moved, waited))


class _Taken(Exception):
    """A returned item was taken by another candidate between the read and the update."""


class ConsumptionStore:
    """The consumption methods of ``RecordStore`` (which provides the engines)."""

    def consume(self, candidate_id: str, scenario: str, *, record_ids: Sequence[str] = (),
                report_ids: Sequence[str] = (), candidate: CandidateRow | None = None) -> None:
        """Mark records and reports as used by ``candidate_id``, all or nothing.

        An item is taken when no candidate consumed it yet (a new row) or when a candidate
        returned it (its row, compare-and-set on ``state='returned'``; one attempt more).
        ConflictError when any of them is held or spent: nothing is marked, so no record ever
        trains two candidates at the same time.

        ``candidate``: the candidate's row (id ``candidate_id``), stored in the same transaction,
        so a process that dies afterwards leaves a candidate the next growth lease holder
        settles, never experience held by no candidate.
        """
        items = {i: "record" for i in record_ids}
        items.update({i: "report" for i in report_ids})
        if not items and candidate is None:
            return
        now = utcnow()
        try:
            with self._writer.begin() as conn:
                if candidate is not None:
                    table = CandidateRow.__table__
                    conn.execute(insert(table).values(
                        {c.name: getattr(candidate, c.name) for c in table.columns if c.name != "seq"}))
                returned = set(conn.execute(select(Consumption.item_id).where(
                    Consumption.item_id.in_(items), Consumption.state == "returned")).scalars())
                if returned:
                    taken = conn.execute(
                        update(Consumption)
                        .where(Consumption.item_id.in_(returned), Consumption.state == "returned")
                        .values(candidate_id=candidate_id, state="held", attempts=Consumption.attempts + 1,
                                created_at=now)).rowcount
                    if taken != len(returned):
                        raise _Taken
                fresh = [{"item_id": i, "item_kind": kind, "candidate_id": candidate_id, "scenario": scenario,
                          "created_at": now, "state": "held", "attempts": 1}
                         for i, kind in items.items() if i not in returned]
                if fresh:
                    conn.execute(insert(Consumption.__table__), fresh)
        except (IntegrityError, _Taken):
            taken = self.consumed(items)
            raise ConflictError(
                f"already consumed by another candidate: {', '.join(sorted(taken)) or 'unknown'}"
            ) from None

    def consumed(self, item_ids: Iterable[str]) -> set[str]:
        """Which of ``item_ids`` are consumed: held by a candidate or spent (not returned)."""
        ids = list(item_ids)
        if not ids:
            return set()
        q = select(Consumption.item_id).where(Consumption.item_id.in_(ids), Consumption.state != "returned")
        with self._reader.connect() as conn:
            return set(conn.execute(q).scalars())

    def held_unpublished(self, item_ids: Iterable[str]) -> set[str]:
        """Which of ``item_ids`` a candidate that was not published holds or spent (not returned):
        what a recipe that keeps a lineage trained its lineage on while serving did not change
        (``task_suite``'s traffic tasks are never drawn from it). One query."""
        ids = [i for i in dict.fromkeys(item_ids) if storable(i)]
        out: set[str] = set()
        with self._reader.connect() as conn:
            for start in range(0, len(ids), 2000):  # the window's reports may quote many records each
                q = (select(Consumption.item_id).join(CandidateRow, CandidateRow.id == Consumption.candidate_id)
                     .where(Consumption.item_id.in_(ids[start:start + 2000]), Consumption.state != "returned",
                            CandidateRow.status != "published"))
                out.update(conn.execute(q).scalars())
        return out

    def outside_pool(self, scenario: str, item_ids: Iterable[str], rule: PoolRule) -> set[str]:
        """Which of ``item_ids`` (records or reports of ``scenario``) are not in its pool under
        ``rule``: held, spent, or returned and not back yet. One query."""
        ids = [i for i in dict.fromkeys(item_ids) if storable(i)]
        if not ids:
            return set()
        q = select(Consumption.item_id).where(Consumption.item_id.in_(ids), ~back_in_pool(scenario, rule))
        with self._reader.connect() as conn:
            return set(conn.execute(q).scalars())

    def consumption_states(self, item_ids: Iterable[str]) -> dict[str, tuple[str, int]]:
        """{item id: (state, attempts)} of those of ``item_ids`` a candidate consumed."""
        ids = list(item_ids)
        if not ids:
            return {}
        q = select(Consumption.item_id, Consumption.state, Consumption.attempts).where(Consumption.item_id.in_(ids))
        with self._reader.connect() as conn:
            return {i: (state, n) for i, state, n in conn.execute(q)}

    def experience_of(self, candidate_id: str) -> dict[str, dict[str, int]]:
        """{"reports"|"records": {state: count}} of the items whose consumption still names
        ``candidate_id`` (an item a later candidate took counts there)."""
        q = (select(Consumption.item_kind, Consumption.state, func.count())
             .where(Consumption.candidate_id == candidate_id)
             .group_by(Consumption.item_kind, Consumption.state))
        out: dict[str, dict[str, int]] = {"reports": {}, "records": {}}
        with self._reader.connect() as conn:
            for kind, state, n in conn.execute(q):
                out[f"{kind}s"][state] = n
        return out

    def release_consumption(self, candidate_id: str) -> int:
        """Undo what ``candidate_id`` consumed (its proposal failed before evaluation): items it
        took fresh are unconsumed again, items it took back are returned again, as before."""
        mine = and_(Consumption.candidate_id == candidate_id, Consumption.state == "held")
        with self._writer.begin() as conn:
            gone = conn.execute(delete(Consumption).where(mine, Consumption.attempts <= 1)).rowcount
            back = conn.execute(update(Consumption).where(mine, Consumption.attempts > 1)
                                .values(state="returned", attempts=Consumption.attempts - 1)).rowcount
        return gone + back

    @staticmethod
    def _return_experience(conn: Any, row: CandidateRow, max_attempts: int) -> None:
        """In ``conn``'s transaction: ``row``'s held items go back to the pool under the return
        rule, or are spent once attempted ``max_attempts`` times."""
        mine = and_(Consumption.candidate_id == row.id, Consumption.state == "held")
        conn.execute(update(Consumption).where(mine, Consumption.attempts >= max_attempts).values(state="spent"))
        mark = select(func.max(Report.seq)).where(Report.scenario == row.scenario).scalar_subquery()
        conn.execute(update(Consumption).where(mine, Consumption.attempts < max_attempts)
                     .values(state="returned", base_release_id=row.base_release_id, returned_after_seq=mark))

    def consumed_content_hashes(self, scenario: str, hashes: Iterable[str]) -> set[str]:
        """Which of ``hashes`` belong to records of ``scenario`` that a candidate already consumed
        (the ``dedup`` filter's memory across growth steps)."""
        hashes = [h for h in dict.fromkeys(hashes) if h]
        if not hashes:
            return set()
        q = (select(Record.content_hash)
             .join(Consumption, Consumption.item_id == Record.id)
             .where(Record.scenario == scenario, Record.content_hash.in_(hashes), Consumption.state != "returned")
             .distinct())
        with self._reader.connect() as conn:
            return set(conn.execute(q).scalars())
