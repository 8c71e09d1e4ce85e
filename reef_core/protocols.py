"""What each kind of registered plugin object must provide, derived from ``reef_core.contracts``.

The kernel checks these at start-up (``PluginRegistry.register``) so a plugin that misses a
method fails with a message naming it, instead of failing mid-request. The check is
structural: an object need not subclass its contract, it needs the contract's abstract methods
(and, once built, its annotated attributes without a value). ``conform`` then gives every
object the contract's optional members, once, when it is built.

Every registered class is built by ``cls(**options)``, where ``options`` is its config group
minus ``name``: the constructor's signature is the schema, and an unknown option is a config
error naming the key. Kernel services (``state_dir``, ``store``, ``runtime``) are passed only
to constructors that declare a parameter of that name.
"""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

from .contracts import CONTRACTS, TrainableBase

T = TypeVar("T")


def required_methods(contract: type) -> tuple[str, ...]:
    """The contract's abstract methods, sorted."""
    return tuple(sorted(getattr(contract, "__abstractmethods__", ())))


def required_attributes(contract: type) -> tuple[str, ...]:
    """Attributes the contract annotates without giving them a value (in declaration order)."""
    names: list[str] = []
    for klass in reversed(contract.__mro__):
        if klass is object or klass.__module__ != contract.__module__:
            continue
        for name in inspect.get_annotations(klass):
            if not name.startswith("_") and name not in vars(klass) and name not in names:
                names.append(name)
    return tuple(names)


KINDS: dict[str, dict[str, tuple[str, ...]]] = {
    # kind: {"methods": required callables, "attributes": required attributes}
    kind: {"methods": required_methods(contract), "attributes": required_attributes(contract)}
    for kind, contract in CONTRACTS.items()
}

HOOK_FOR_KIND = {
    "runtime": "register_runtimes",
    "recipe": "register_recipes",
    "evaluator": "register_evaluators",
    "record_filter": "register_record_filters",
    "artifact_store": "register_artifact_stores",
    "harness_adapter": "register_harness_adapters",
    "grader": "register_graders",
}


#: capabilities (small protocols) an object of a kind may offer: all of their methods, or none
CAPABILITIES: dict[str, tuple[type, ...]] = {"runtime": (TrainableBase,)}


def capability_methods(capability: type) -> tuple[str, ...]:
    return tuple(sorted(n for n in vars(capability) if not n.startswith("_") and callable(vars(capability)[n])))


def _implements(obj: object, method: str) -> bool:
    member = getattr(obj, method, None)
    return callable(member) and not getattr(member, "__isabstractmethod__", False)


def missing_members(kind: str, obj: object, *, attributes: bool = True) -> list[str]:
    """Names of required members ``obj`` lacks for ``kind`` (empty when it conforms).

    A registered class is checked for its methods at registration; attributes may be set in
    ``__init__`` (from options), so they are checked on the instance (``attributes=True``).
    A method the contract declares abstract and ``obj`` inherits unimplemented counts as missing.
    """
    spec = KINDS[kind]
    missing = [m for m in spec["methods"] if not _implements(obj, m)]
    if attributes:
        missing += [a for a in spec["attributes"] if not hasattr(obj, a)]
    for capability in CAPABILITIES.get(kind, ()):  # half a capability is a mistake, not an option
        methods = capability_methods(capability)
        have = [m for m in methods if _implements(obj, m)]
        if have and len(have) < len(methods):
            missing += [f"{m} (of {capability.__name__})" for m in methods if m not in have]
    return missing


class _Conformed:
    """An object that provides a contract's required members without subclassing it, seen
    through the contract: the object's own members first, the contract's defaults (which
    call back into the object) for the optional members it lacks. Setting an attribute sets
    it on the object."""

    def __init__(self, inner: Any):
        object.__setattr__(self, "_inner", inner)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("__") or name == "_inner":
            return object.__getattribute__(self, name)
        inner = object.__getattribute__(self, "_inner")
        try:
            return getattr(inner, name)
        except AttributeError:
            return object.__getattribute__(self, name)  # the contract's default, or AttributeError

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_inner"), name, value)

    def __repr__(self) -> str:
        return repr(object.__getattribute__(self, "_inner"))


_adapters: dict[type, type] = {}


def _adapter_class(contract: type) -> type:
    if contract not in _adapters:
        cls = type(f"Conformed{contract.__name__}", (_Conformed, contract), {"__module__": __name__})
        cls.__abstractmethods__ = frozenset()  # the required members come from the wrapped object
        _adapters[contract] = cls
    return _adapters[contract]


def conform(kind: str, obj: Any) -> Any:
    """``obj`` as an instance of its kind's contract: itself when it subclasses the contract (or
    the contract is a protocol, like graders), else an adapter that adds the contract's default
    implementations of the optional members ``obj`` lacks. Idempotent."""
    contract = CONTRACTS[kind]
    if getattr(contract, "_is_protocol", False) or isinstance(obj, contract):
        return obj
    return _adapter_class(contract)(obj)


def unwrap(obj: T) -> T:
    """The object ``conform`` wrapped (``obj`` itself when it was not wrapped)."""
    if isinstance(obj, _Conformed):
        return object.__getattribute__(obj, "_inner")
    return obj


def _call(contract: type, name: str) -> str:
    """``name(param, ...)`` of a contract method (``*`` before keyword-only ones), or ``name``."""
    member = inspect.getattr_static(contract, name)
    if not callable(member):
        return f"`{name}`"
    shown, star = [], False
    for p in list(inspect.signature(member).parameters.values())[1:]:
        if p.kind is p.KEYWORD_ONLY and not star:
            shown.append("*")
            star = True
        shown.append(p.name)
    return f"`{name}({', '.join(shown)})`"


def optional_members(contract: type) -> tuple[str, ...]:
    """Public members the contract implements (the defaults a conforming object may override)."""
    required = set(required_methods(contract)) | set(required_attributes(contract))
    return tuple(name for name in vars(contract) if not name.startswith("_") and name not in required)


def contracts_table() -> str:
    """The Markdown table of every contract that docs/plugins.md carries (a test keeps them equal)."""
    rows = ["| kind (hook) | contract | required | optional, with a default on the contract |", "|---|---|---|---|"]
    for kind, contract in CONTRACTS.items():
        required = [_call(contract, m) for m in required_methods(contract)]
        required += [f"`{a}`" for a in required_attributes(contract)]
        optional = [_call(contract, m) for m in optional_members(contract)] or ["—"]
        rows.append(f"| {kind} (`{HOOK_FOR_KIND[kind]}`) | `reef_core.{contract.__name__}` | {', '.join(required)} "
                    f"| {', '.join(optional)} |")
    return "\n".join(rows)
