"""Helpers for the reef-torch tests: releases, and ways to hold the engine at a known point.

The tiny model and the word-loving adapter come from ``reef_train.testing``."""

from __future__ import annotations

from pathlib import Path


def release(scenario: str, release_id: str, root: Path, adapter_from: Path | None = None):
    """An ``ActiveRelease`` whose artifact holds a copy of ``adapter_from`` (or no adapter)."""
    import shutil

    from reef_core import ActiveRelease

    path = root / f"{scenario}-{release_id}"
    path.mkdir(parents=True, exist_ok=True)
    if adapter_from is not None:
        shutil.copytree(adapter_from, path / "adapter", dirs_exist_ok=True)
    else:
        (path / "harness").mkdir(exist_ok=True)
    return ActiveRelease(scenario=scenario, release_id=release_id, path=path)


class Gate:
    """Pause the engine's worker right after it sampled a token for a row matching ``when``.

    Tests use it to hold a sequence in flight deterministically (no timing): while paused,
    the batch is frozen mid-generation; ``open()`` lets it continue."""

    def __init__(self, engine, when):
        import threading

        self.reached = threading.Event()
        self._release = threading.Event()
        inner = engine._advance

        def advance(row, tok):
            done = inner(row, tok)
            if not self.reached.is_set() and when(row):
                self.reached.set()
                self._release.wait(60)
            return done

        engine._advance = advance

    async def wait(self) -> None:
        import asyncio

        assert await asyncio.to_thread(self.reached.wait, 60), "the engine never reached the gate"

    def open(self) -> None:
        self._release.set()


async def wait_until(predicate, what: str) -> None:
    """Poll ``predicate`` (cheap, no model work) until true; fail after many tries."""
    import asyncio

    for _ in range(6000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting until {what}")


class Blocker:
    """Queue a command that parks the engine's worker between two steps until ``open()``.

    Commands run in order, so a Blocker queued behind an adapter load pauses the worker
    right after that load, with the batch still holding whatever was in flight."""

    def __init__(self, engine):
        import threading

        self.entered = threading.Event()
        self._release = threading.Event()

        def block():
            self.entered.set()
            self._release.wait(60)

        self.future = engine.call(block)

    async def wait(self) -> None:
        import asyncio

        assert await asyncio.to_thread(self.entered.wait, 60), "the engine never ran the blocker"

    def open(self) -> None:
        self._release.set()
