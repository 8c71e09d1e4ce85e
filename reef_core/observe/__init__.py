"""Observe: what a scenario may learn from (experience, batches, record filters)."""

from ..kit.lazy import lazy_exports

# Loaded on first use: eligibility reads the store; a record filter needs only the values.
__getattr__ = lazy_exports(__name__, {
    ".eligibility": ("FilterContext", "build_filters", "eligible", "load_pool", "parse_filter_spec"),
    ".experience": ("Batch", "Experience", "ExperienceRecord", "record_content_hash", "response_text"),
})

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
