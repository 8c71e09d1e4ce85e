"""Composing a kernel: the one place that decides what a running Reef is made of.

``build_reef`` builds the kernel (settings, plugins, record store, runtime, serving
releases) and attaches the learning loop as an in-process plugin. The server, the CLI and
the test server all compose through it; a kernel built with ``Reef(...)`` alone serves and
follows releases but learns nothing.
"""

from __future__ import annotations

from typing import Any

from .config import Settings
from .kernel import Reef, startup_error
from .plugins import Plugins


def build_reef(settings: Settings, plugins: Plugins, *, store: Any = None, runtime: Any = None,
               background: bool = True, learning: bool = True) -> Reef:
    """The kernel with the learning loop attached (``reef.learning``) unless ``learning=False``.

    ``background=False`` is for one-shot use (the CLI): no follower, no growth workers or
    schedule; growth steps run only when asked. A configuration error of the loop (an unknown
    recipe, a bad option) raises here, before anything starts, and closes what was opened.
    """
    reef = Reef(settings, plugins, store=store, runtime=runtime, background=background)
    if learning:
        from .grow import LearningLoop

        try:
            loop = LearningLoop(reef)
        except Exception as exc:
            reef.close_unstarted()
            error = startup_error("the learning loop could not be set up", exc)
            if error is exc:
                raise
            raise error from exc
        reef.learning = loop
        reef.register(loop, name="reef.learning")
    return reef
