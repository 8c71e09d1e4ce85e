"""Python's garbage collector tuned for serving.

A server process holds a few hundred thousand long-lived objects once it has started (the
app, the kernel, SQLAlchemy's and pydantic's metadata, the model's Python side). CPython
scans all of them in each full collection, and under load full collections come often:
the objects of the requests in flight survive the young collections and are promoted, so
the old generation's "pending" share keeps crossing its threshold. Measured with the
proxy bench's stub at concurrency 32: 10 full collections in 20 s, the longest 130-185 ms,
each a stall of every request in flight.

So, once the kernel has started and before the first request, ``gc.freeze()`` moves every
object to the permanent generation that collections skip (no collection first: a full one
costs ~0.1 s of start-up, and what garbage start-up left is small), and the youngest
generation's threshold is raised from 700 allocations to ``server.gc_young_threshold``: a
young collection runs when allocations minus frees pass it, and with 32 requests in flight
their live objects alone pass 700, so every few requests a collection scanned them and
promoted the survivors. With 20,000 the same bench ran 20 s without any collection while
serving (700: ~1,100 young, ~100 middle and 10 full ones). Reference cycles are still collected,
only less often.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("reef.serve")


def tune_for_serving(young_threshold: int | None) -> None:
    """Freeze what start-up built and set the young generation's threshold (``None``: Python's
    own)."""
    gc.freeze()
    if young_threshold is not None:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, old)
    log.debug("gc: %d start-up objects frozen, thresholds %s", gc.get_freeze_count(), gc.get_threshold())
