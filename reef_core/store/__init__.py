"""Reef's record store: SQLModel tables, SQLite (WAL) or PostgreSQL, Alembic migrations."""

from .consumption import PoolRule
from .ids import new_id
from .leases import LEASE_CHANNEL, LeaseLost
from .models import (
    CandidateRow,
    Consumption,
    EpisodeRow,
    GrowthLease,
    Record,
    Release,
    Report,
    ReportReference,
    to_json,
    utcnow,
)
from .recordstore import RecordStore, ScenarioMismatch

__all__ = [
    "CandidateRow",
    "Consumption",
    "EpisodeRow",
    "GrowthLease",
    "LEASE_CHANNEL",
    "LeaseLost",
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
