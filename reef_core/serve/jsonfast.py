"""Kept importable for the server's modules: the fast JSON helpers live in ``reef_core.kit.jsonfast``."""

from ..kit.jsonfast import BACKEND, dumps, loads, nesting_depth

__all__ = ["BACKEND", "dumps", "loads", "nesting_depth"]
