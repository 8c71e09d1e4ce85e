"""Checking plugin option values against the constructor's type annotations.

A plugin's constructor is the schema of its config group: the keys are its parameters, and
the types are their annotations. Config values come from YAML and the command line, so they
are JSON-shaped (numbers, strings, booleans, null, lists, mappings); each one is checked as
pydantic checks JSON in strict mode: ``"two"`` is not an ``int``, ``1`` is not a ``bool``, an
``int`` is a fine ``float``, a string is a fine ``Path``, a list is a fine ``tuple``.
Parameters annotated ``Any`` or not at all, annotations that cannot be resolved, and types
pydantic cannot check take anything. The value the constructor receives is the one given.
"""

from __future__ import annotations

import functools
import inspect
import json
import types
import typing
from typing import Any

from pydantic import TypeAdapter, ValidationError

#: annotations that accept every value
_UNCHECKED = (Any, object, inspect.Parameter.empty)


def option_annotations(factory: Any) -> dict[str, Any]:
    """Parameter name → resolved annotation, for each parameter of ``factory`` that has one.

    String annotations (``from __future__ import annotations``) are resolved with
    ``typing.get_type_hints``; one that names something undefined is left out (not checked).
    """
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    source = _annotated_callable(factory)
    try:
        hints = typing.get_type_hints(source, include_extras=True)
    except Exception:  # one unresolvable hint spoils the batch: resolve them one by one below
        hints = {}
    namespace = _module_namespace(source, factory)
    found: dict[str, Any] = {}
    for p in params.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        annotation = hints.get(p.name, p.annotation)
        if isinstance(annotation, str):
            annotation = _resolve(annotation, namespace)
        if annotation is None or any(annotation is u for u in _UNCHECKED) or isinstance(annotation, typing.TypeVar):
            continue
        found[p.name] = annotation
    return found


def option_type_problem(annotation: Any, value: Any, default: Any = inspect.Parameter.empty) -> str | None:
    """Why ``value`` does not fit ``annotation`` (``"expected int"``), or None when it does."""
    if value is None and default is None:  # ``x: int = None``: null keeps the default's meaning
        return None
    adapter = _adapter(annotation)
    if adapter is None:
        return None
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):  # not a config value (an object passed in-process): not checked
        return None
    try:
        adapter.validate_json(text, strict=True)
    except ValidationError:
        return f"expected {type_name(annotation)}"
    return None


def shown_value(key: str, value: Any, limit: int = 60) -> str:
    """``value`` as an error message quotes it: shortened, and only its type under a secret key."""
    from .config import is_secret_key, mask_secrets

    if is_secret_key(key):
        return f"a value of type {type(value).__name__}"
    text = repr(mask_secrets(value, key))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def type_name(annotation: Any) -> str:
    """``int``, ``float | None``, ``list[str]``: the annotation as a person writes it."""
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin is typing.Union or isinstance(annotation, types.UnionType):
        return " | ".join(type_name(arg) for arg in typing.get_args(annotation))
    return str(annotation).replace("typing.", "").replace("NoneType", "None").replace("pathlib.", "")


def _annotated_callable(factory: Any) -> Any:
    """Where the constructor's annotations live: ``__init__`` (or ``__new__``) of a class."""
    if isinstance(factory, type):
        if factory.__init__ is not object.__init__:
            return factory.__init__
        if factory.__new__ is not object.__new__:
            return factory.__new__
    return factory


def _module_namespace(source: Any, factory: Any) -> dict[str, Any]:
    namespace = getattr(inspect.unwrap(source), "__globals__", None)
    if isinstance(namespace, dict):
        return namespace
    module = inspect.getmodule(factory)
    return dict(vars(module)) if module is not None else {}


def _resolve(annotation: str, namespace: dict[str, Any]) -> Any:
    holder = types.SimpleNamespace(__annotations__={"value": annotation})
    try:
        return typing.get_type_hints(holder, globalns=namespace, include_extras=True)["value"]
    except Exception:  # a name that is not defined where the constructor is: not checked
        return None


def _adapter(annotation: Any) -> TypeAdapter | None:
    try:
        return _cached_adapter(annotation)
    except TypeError:  # unhashable annotation (e.g. Annotated with an unhashable marker)
        return _build_adapter(annotation)


@functools.lru_cache(maxsize=512)
def _cached_adapter(annotation: Any) -> TypeAdapter | None:
    return _build_adapter(annotation)


def _build_adapter(annotation: Any) -> TypeAdapter | None:
    try:
        return TypeAdapter(annotation)
    except Exception:  # a type pydantic cannot check (an arbitrary class): anything goes
        return None
