"""A package whose public names import on first use (PEP 562), so importing it stays cheap.

Every ``reef`` command loads every installed plugin to read its entry point, config directory
and registrations; a plugin package that imports its training code at the top makes each of
them pay for torch. With ``lazy_exports`` the package's ``__init__`` names what it offers and
where it lives; ``from package import Name`` still works and imports that module then::

    __getattr__ = lazy_exports(__name__, {".recipe": ("TTTDRecipe",), ".grid": ("GridFilter", "barrier")})

Only ``__getattr__`` is given, not ``__dir__``: pluggy looks at every name ``dir()`` lists for
hook implementations, and listing the lazy names would import them all when the plugin loads.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each name of ``exports`` (module →
    names; a module starting with ``.`` is relative to ``package``) on first access and keeps it
    in the package, so the next access is a plain attribute."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


__all__ = ["lazy_exports"]
