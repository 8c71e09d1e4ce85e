"""Observe: what a scenario may learn from (experience, batches, record filters)."""

from .eligibility import (
    FilterContext,
    build_filters,
    eligible,
    load_pool,
    parse_filter_spec,
)
from .experience import (
    Batch,
    Experience,
    ExperienceRecord,
    record_content_hash,
    response_text,
)

__all__ = [
    "Batch",
    "Experience",
    "ExperienceRecord",
    "FilterContext",
    "build_filters",
    "eligible",
    "load_pool",
    "parse_filter_spec",
    "record_content_hash",
    "response_text",
]
