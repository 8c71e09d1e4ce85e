"""Reef's record store: SQLModel tables, SQLite (WAL) or PostgreSQL, Alembic migrations."""

from .models import CandidateRow, Consumption, Record, Release, Report, ReportReference, new_id, to_json, utcnow
from .recordstore import RecordStore, ScenarioMismatch

__all__ = [
    "CandidateRow",
    "Consumption",
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
