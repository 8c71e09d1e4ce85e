"""Reef's record store: SQLModel tables, SQLite (WAL) or PostgreSQL, Alembic migrations."""

from .consumption import PoolRule
from .models import (
    CandidateRow,
    Consumption,
    EpisodeRow,
    Record,
    Release,
    Report,
    ReportReference,
    new_id,
    to_json,
    utcnow,
)
from .recordstore import RecordStore, ScenarioMismatch

__all__ = [
    "CandidateRow",
    "Consumption",
    "EpisodeRow",
    "PoolRule",
    "Record",
    "RecordStore",
    "Release",
    "Report",
    "ReportReference",
    "ScenarioMismatch",
    "new_id",
    "to_json",
    "utcnow",
]
