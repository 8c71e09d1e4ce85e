"""Observe: what a scenario may learn from (experience, batches, record filters)."""

from .eligibility import (
    FilterContext,
    build_filters,
    eligible,
    load_pool,
    parse_filter_spec,
)
from .experience import Batch, Experience, ExperienceRecord, response_text

__all__ = [
    "Batch",
    "Experience",
    "ExperienceRecord",
    "FilterContext",
    "build_filters",
    "eligible",
    "load_pool",
    "parse_filter_spec",
    "response_text",
]
