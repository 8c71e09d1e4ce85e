"""Stopping a training step part-way, when the process that runs it is stopping.

A server told to stop (SIGTERM) in the middle of a training step would otherwise wait for the
step to end: minutes on a real model. The caller hands ``run_steps`` (or a trainer's ``run``) a
``threading.Event`` (a recipe passes ``ctx.stopping``); the step checks it before every
optimizer step and between batches, and raises ``Stopped`` once it is set. Nothing of a stopped
step is saved, so a lineage's head stays at the last step that completed, as after a crash.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class Stopped(Exception):
    """The training step was stopped before it finished; nothing of it was saved."""


_event: ContextVar[threading.Event | None] = ContextVar("reef_train_stop", default=None)


@contextmanager
def stop_on(event: threading.Event | None) -> Iterator[None]:
    """Within the block, ``check`` raises ``Stopped`` once ``event`` is set (None: never)."""
    token = _event.set(event)
    try:
        yield
    finally:
        _event.reset(token)


def check() -> None:
    """Raise ``Stopped`` when the step running in this context was asked to stop."""
    event = _event.get()
    if event is not None and event.is_set():
        raise Stopped("the training step was stopped before it finished (its process is stopping); "
                      "nothing of it was saved")
