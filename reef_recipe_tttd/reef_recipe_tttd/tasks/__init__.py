"""Discovery tasks: the toy ones shipped with the package, and how to name your own.

``load_task("circles3")``, ``load_task("spread5")``, ``load_task("circles3-program")`` build the
shipped tasks (any k or n); ``load_task("my.module:MY_TASK")`` imports a ``Task`` instance (or a
class / factory called with no arguments) from your code.
"""

from __future__ import annotations

import importlib
import re

from .base import Task, Verdict, invalid
from .circles import CirclePacking
from .spread import NumericSpread

__all__ = ["CirclePacking", "NumericSpread", "Task", "Verdict", "invalid", "load_task", "SHIPPED"]

#: shipped task families: name pattern → factory
SHIPPED = {
    r"circles(\d+)": lambda k: CirclePacking(int(k)),
    r"circles(\d+)-program": lambda k: CirclePacking(int(k), kind="program"),
    r"spread(\d+)": lambda n: NumericSpread(int(n)),
}


def load_task(name: str) -> Task:
    """A shipped task by name (``circles3``, ``circles3-program``, ``spread5``) or yours as ``module:attr``."""
    for pattern, make in SHIPPED.items():
        m = re.fullmatch(pattern, name)
        if m:
            return make(*m.groups())
    if ":" in name:
        module, _, attr = name.partition(":")
        obj = getattr(importlib.import_module(module), attr)
        task = obj if isinstance(obj, Task) else obj()
        if not isinstance(task, Task):
            raise TypeError(f"{name} is not a reef_recipe_tttd.tasks.Task (nor a class or factory making one)")
        return task
    raise ValueError(f"no task named {name!r}: use circles<k>, circles<k>-program, spread<n> or module:attr")
