"""A plugin under test inside the kernel, without installing its distribution.

``registered(kind, name, obj)`` stands in for the entry point: while the block runs, the
process's plugins (what ``ReefServer`` and ``reef_settings`` load) include ``obj`` under
``name``, checked against its contract as a real registration is. ``build_configured(kind,
overrides)`` is what the kernel builds for ``kind`` from a composed configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import PluginError
from ..protocols import missing_members


@contextmanager
def registered(kind: str, name: str, obj: Any, *, plugin: str = "tests") -> Iterator[None]:
    """Register ``obj`` as ``kind`` ``name`` in this process's plugins for the block (restored after).

    Raises ``PluginError`` when ``obj`` lacks a required member of its contract, like a
    registration through the ``register_*`` hooks does."""
    from ..plugins import Registered, get_plugins

    missing = missing_members(kind, obj, attributes=not isinstance(obj, type))
    if missing:
        raise PluginError(f"plugin {plugin!r} registered {kind} {name!r} without required member(s): {', '.join(missing)}")
    table = get_plugins().registry.setdefault(kind, {})
    previous = table.get(name)
    table[name] = Registered(kind, name, obj, plugin)
    try:
        yield
    finally:
        if previous is None:
            table.pop(name, None)
        else:
            table[name] = previous


def build_configured(kind: str, overrides: Iterable[str] = (), *, env: dict[str, str] | None = None,
                     **services: Any) -> Any:
    """The ``kind`` object (``runtime``, ``recipe``, ...) the kernel builds from ``overrides``.

    Composes the configuration with the plugins ``env`` selects (``{"REEF_PLUGINS": "torch"}``;
    default: this process's plugins), takes ``kind``'s name and options from it and builds the
    object as the kernel does, passing ``services`` (``state_dir``, ...) its constructor declares."""
    from omegaconf import OmegaConf

    from ..config import compose
    from ..plugins import get_plugins, instantiate, load_plugins

    plugins = get_plugins() if env is None else load_plugins(env=env)
    cfg = compose(list(overrides), plugins)
    options = OmegaConf.to_container(cfg[kind], resolve=True)
    name = options.pop("name")
    return instantiate(kind, name, options, plugins, **services)


__all__ = ["build_configured", "registered"]
