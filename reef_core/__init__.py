"""Reef: an inference server that learns from the experience it serves."""

from .hookspecs import hookimpl, hookspec
from .runtime import Runtime
from .types import ActiveRelease, Candidate, Decision, Evaluation, InferenceCall

__version__ = "0.1.0"

__all__ = [
    "ActiveRelease",
    "Candidate",
    "Decision",
    "Evaluation",
    "InferenceCall",
    "Runtime",
    "hookimpl",
    "hookspec",
    "__version__",
]
