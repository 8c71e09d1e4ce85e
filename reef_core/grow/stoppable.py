"""Blocking work of a growth step (a recipe's ``propose``, the gate) in a thread that a stopping
server does not wait for.

``asyncio.to_thread`` runs work in the event loop's default executor, whose threads are joined
both when ``asyncio.run`` closes the loop and when the interpreter exits: a server told to stop
in the middle of a training step or an evaluation waited for it to end, minutes on a real model.
Here the work runs in a daemon thread. When the task awaiting it is cancelled (the server is
stopping), ``stop`` is set and the work has ``grace_s`` to notice and end: a recipe checks
``ctx.stopping`` (reef-train's ``run_steps`` does, before every optimizer step) and model calls
through the step's context raise once it is set. The cancellation goes on either way.

What the work leaves unfinished is safe to lose: a lineage saves a step only once it completed
and moves its head only while the step is not stopping (``RecipeContext.fence``), and the
step's candidate is settled as one whose process died (``reef_core.grow.step``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("reef.grow")

T = TypeVar("T")


async def run_stoppable(fn: Callable[..., T], *args: Any, stop: threading.Event, grace_s: float,
                        name: str) -> T:
    """``fn(*args)`` in a daemon thread named ``name`` (with this task's context variables, as
    ``asyncio.to_thread``); on cancellation, set ``stop``, wait up to ``grace_s`` for ``fn`` to
    end, and re-raise the cancellation."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    # an outcome nobody awaits any more (the grace ran out) is not an "exception never retrieved"
    done.add_done_callback(lambda f: f.cancelled() or f.exception())
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if not done.done():
            done.set_result(value) if ok else done.set_exception(value)

    def work() -> None:
        try:
            outcome = (True, context.run(fn, *args))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, as to_thread does
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is closed: nobody waits for it any more
            pass

    threading.Thread(target=work, name=name, daemon=True).start()
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(done), grace_s)
        except asyncio.TimeoutError:
            log.warning("%s did not stop within %gs; leaving it behind", name, grace_s)
        except Exception:  # noqa: BLE001 - it ended, by raising (Stopped, EvaluationCancelled): as asked
            pass
        raise
