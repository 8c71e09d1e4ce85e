"""Kept importable for the kernel: the adapter version table lives in ``reef_core.kit.adapters``."""

from .kit.adapters import BASE, AdapterTable, Version, version_name

__all__ = ["BASE", "AdapterTable", "Version", "version_name"]
