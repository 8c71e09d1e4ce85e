"""Reef hooks of ``reef-sglang``: the ``sglang`` runtime and its config group."""

from __future__ import annotations

from pathlib import Path

from reef_core import hookimpl


@hookimpl
def register_runtimes(register):
    from .runtime import SGLangRuntime

    register("sglang", SGLangRuntime)


@hookimpl
def reef_config_dir():
    return str(Path(__file__).resolve().parent / "conf")
