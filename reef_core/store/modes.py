"""Per-scenario learning modes, stored so they survive restarts (``docs/modes.md``).

One ``scenario_modes`` row per scenario whose mode was set: through the API, the CLI or the
dashboard (``set_by`` names who), or from the configuration (``set_by = "config"``: the
mode the configuration last gave, kept so that a configuration change across a restart is a
transition like any other). A scenario without a row runs in its configured mode.

The row also holds the watermark a scenario sets when it leaves ``record_only``: the
scenario's newest record and report seq at that moment. What was recorded up to then never
becomes experience (``pool_start``; ``reef_core.observe.eligibility`` applies it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, SQLModel

from .models import Record, Report, storable, utcnow

#: ``set_by`` of a row that only remembers the configured mode (the API, CLI or UI never set it)
CONFIG = "config"
RECORD_ONLY = "record_only"


class ScenarioModeRow(SQLModel, table=True):
    """A scenario's learning mode, since when and who set it, and its record_only watermark."""

    __tablename__ = "scenario_modes"

    scenario: str = Field(primary_key=True, max_length=200)
    mode: str = Field(max_length=16)  # auto | manual | paused | record_only
    since: datetime = Field(default_factory=utcnow)
    set_by: str | None = Field(default=None, max_length=200)
    #: records of the scenario at or below this seq never become experience (left record_only then)
    pool_after_record_seq: int | None = None
    #: reports of the scenario at or below this seq never become experience
    pool_after_report_seq: int | None = None


@dataclass(frozen=True)
class PoolStart:
    """Where a scenario's pool starts: ``closed`` while it records only (nothing recorded now
    is ever experience); otherwise records and reports above the two seqs (None: all)."""

    closed: bool = False
    after_record_seq: int | None = None
    after_report_seq: int | None = None

    def admits_record(self, seq: int | None) -> bool:
        return not self.closed and (self.after_record_seq is None or (seq or 0) > self.after_record_seq)


def mode_json(row: ScenarioModeRow) -> dict[str, Any]:
    """``{"scenario", "mode", "since", "set_by"}``; ``set_by`` is None for a configured mode."""
    return {"scenario": row.scenario, "mode": row.mode, "since": row.since.isoformat(),
            "set_by": None if row.set_by == CONFIG else row.set_by}


class ModeStore:
    """The learning-mode methods of ``RecordStore`` (which provides the engines)."""

    def scenario_mode(self, scenario: str) -> ScenarioModeRow | None:
        if not storable(scenario):
            return None
        with self._read() as s:
            return s.get(ScenarioModeRow, scenario)

    def scenario_modes(self) -> dict[str, ScenarioModeRow]:
        """Every stored mode row by scenario; one query."""
        with self._read() as s:
            return {r.scenario: r for r in s.execute(select(ScenarioModeRow)).scalars()}

    def set_scenario_mode(self, scenario: str, mode: str, *, set_by: str | None, in_effect: str) -> ScenarioModeRow:
        """Store ``mode`` for ``scenario`` (``in_effect``: the mode it has when no row is
        stored, the configured one). Leaving ``record_only`` sets the watermark to the
        scenario's newest record and report, in the same transaction; setting the mode it
        already has keeps ``since``, and only records who set it."""
        try:
            return self._set_mode(scenario, mode, set_by, in_effect)
        except IntegrityError:  # another process stored the scenario's first row meanwhile
            return self._set_mode(scenario, mode, set_by, in_effect)

    def _set_mode(self, scenario: str, mode: str, set_by: str | None, in_effect: str) -> ScenarioModeRow:
        now = utcnow()
        with self._write() as s, s.begin():
            row = s.get(ScenarioModeRow, scenario, with_for_update=True)
            previous = row.mode if row is not None else in_effect
            if row is None:
                row = ScenarioModeRow(scenario=scenario, mode=mode, since=now, set_by=set_by)
                s.add(row)
            elif row.mode != mode:
                row.mode, row.since = mode, now
            row.set_by = set_by
            if previous == RECORD_ONLY and mode != RECORD_ONLY:
                row.pool_after_record_seq = s.execute(
                    select(func.max(Record.seq)).where(Record.scenario == scenario)).scalar()
                row.pool_after_report_seq = s.execute(
                    select(func.max(Report.seq)).where(Report.scenario == scenario)).scalar()
            s.flush()
        return row

    def pool_start(self, scenario: str) -> PoolStart:
        """Where ``scenario``'s pool starts (one primary-key read)."""
        row = self.scenario_mode(scenario)
        if row is None:
            return PoolStart()
        return PoolStart(closed=row.mode == RECORD_ONLY, after_record_seq=row.pool_after_record_seq,
                         after_report_seq=row.pool_after_report_seq)
