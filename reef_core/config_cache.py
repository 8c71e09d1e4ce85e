"""Hydra composition, remembered: the part of ``compose`` that reads config files is done once
per set of config-group choices, and plain value overrides are applied to a copy of it.

Why: one Hydra ``compose`` reads and merges every file of the defaults list (Reef's, each
plugin's and Hydra's own), about 0.1 s, while applying ``server.port=9000`` to a composed config
takes a millisecond. A process composes many times with the same groups and different values
(every server a test starts, ``served_config`` answering the CLI), so most of that time was
Hydra reading the same files again.

Nothing is assumed that Hydra would decide otherwise:

- An override goes to the remembered part when Hydra would treat it as a defaults-list
  override: a ``hydra.`` key, a ``@package``, or a key that names a config group in any
  directory of the search path (``recipe=sao``, ``~evaluator``). Every other override is a
  config override, and is applied with Hydra's own function for those
  (``ConfigLoaderImpl._apply_overrides_to_config``), in the order given, to a struct-mode copy,
  as Hydra applies them after composing.
- Anything that is not a plain override (a sweep ``a=1,2``, a syntax error) is composed by
  Hydra in full, so its error is Hydra's own.
- The key includes every config file's path, size and modification time under the search
  path, so an edited or added file is read again.

``tests/test_config_cache.py`` composes random override lists both ways and compares the
configs and the error messages.
"""

from __future__ import annotations

import copy
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig

#: composed configs kept (each a few hundred keys): distinct group choices in one process are few
MAX_ENTRIES = 16

_cache: OrderedDict[tuple, DictConfig] = OrderedDict()
_lock = threading.Lock()


def fingerprint(dirs: Sequence[str]) -> tuple:
    """Every file under ``dirs``: path, size and modification time (a quarter of a
    millisecond for Reef's and its plugins' config directories)."""
    seen = []
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            subdirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                seen.append((path, st.st_size, st.st_mtime_ns))
    return tuple(seen)


def _is_group(key: str, dirs: Sequence[str]) -> bool:
    return any(os.path.isdir(os.path.join(d, key)) for d in dirs)


def split(overrides: Sequence[str], dirs: Sequence[str]) -> tuple[list[str], list[Any]] | None:
    """``overrides`` as (defaults-list overrides, as given; Hydra's parsed config overrides), or
    None when one is not a plain override (a sweep, a syntax error): Hydra composes those."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    except HydraException:
        return None
    groups, values = [], []
    for o in parsed:
        if o.is_sweep_override():
            return None
        key = o.key_or_group
        if o.is_hydra_override() or o.package is not None or "/" in key or _is_group(key, dirs):
            groups.append(o.input_line)
        else:
            values.append(o)
    return groups, values


def compose(overrides: Sequence[str], dirs: Sequence[str], hydra_compose: Callable[[list[str]], DictConfig]
            ) -> DictConfig:
    """What ``hydra_compose(overrides)`` returns, from a remembered composition of the group
    choices in ``overrides`` when there is one. ``dirs``: the search path's directories.
    ``hydra_compose`` raises what Hydra raises; so does applying a config override."""
    parts = split(overrides, dirs)
    if parts is None:
        return hydra_compose(list(overrides))
    groups, values = parts
    key = (tuple(groups), tuple(dirs), fingerprint(dirs))
    with _lock:
        base = _cache.get(key)
        if base is not None:
            _cache.move_to_end(key)
    if base is None:
        base = hydra_compose(groups)
        with _lock:
            _cache[key] = base
            while len(_cache) > MAX_ENTRIES:
                _cache.popitem(last=False)
    cfg = copy.deepcopy(base)
    if values:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
    return cfg


def clear() -> None:
    """Forget every composed config (tests; a long-lived process never needs to)."""
    with _lock:
        _cache.clear()
