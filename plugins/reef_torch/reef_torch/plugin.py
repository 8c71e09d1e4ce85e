"""Reef hooks of ``reef-torch``: the ``local`` runtime and its config group.

Importing this module is cheap (no torch): the runtime imports its heavy dependencies in
``start()``.
"""

from __future__ import annotations

from pathlib import Path

from reef_core import hookimpl


@hookimpl
def register_runtimes(register):
    from .runtime import LocalRuntime

    register("local", LocalRuntime)


@hookimpl
def reef_config_dir():
    return str(Path(__file__).resolve().parent / "conf")
