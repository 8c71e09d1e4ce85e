"""What each kind of registered plugin object must provide.

The kernel checks these at start-up (``PluginRegistry.register``) so a plugin that misses a
method fails with a message naming it, instead of failing mid-request.

Every registered class is built by ``cls(**options)``, where ``options`` is its config group
minus ``name``: the constructor's signature is the schema, and an unknown option is a config
error naming the key. Kernel services (``state_dir``, ``store``, ``runtime``) are passed only
to constructors that declare a parameter of that name.
"""

from __future__ import annotations

KINDS: dict[str, dict[str, tuple[str, ...]]] = {
    # kind: {"methods": required callables, "attributes": required attributes}
    "runtime": {
        "methods": ("complete", "stream", "activate", "aclose"),
        "attributes": ("dialect",),
    },
    "recipe": {
        "methods": ("propose",),
        "attributes": ("update_target", "filters", "batch_size", "default_evaluator"),
    },
    "evaluator": {"methods": ("evaluate", "decide"), "attributes": ()},
    "record_filter": {"methods": ("apply",), "attributes": ()},
    "artifact_store": {
        "methods": ("head", "publish", "materialize", "history"),
        "attributes": (),
    },
    "harness_adapter": {"methods": ("render",), "attributes": ()},
    "grader": {"methods": ("__call__",), "attributes": ()},
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


def missing_members(kind: str, obj: object, *, attributes: bool = True) -> list[str]:
    """Names of required members ``obj`` lacks for ``kind`` (empty when it conforms).

    A registered class is checked for its methods at registration; attributes may be set in
    ``__init__`` (from options), so they are checked on the instance (``attributes=True``).
    """
    spec = KINDS[kind]
    missing = [m for m in spec["methods"] if not callable(getattr(obj, m, None))]
    if attributes:
        missing += [a for a in spec["attributes"] if not hasattr(obj, a)]
    return missing
