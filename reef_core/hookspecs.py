"""Every hook a Reef plugin can implement, grouped by the loop's lifecycle.

Most hooks are *register callbacks*: the kernel passes ``register`` and the plugin
calls ``register(name, cls)`` once per thing it contributes. The kernel owns naming,
duplicate detection and protocol checks, so plugins stay declarative.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("reef")
hookimpl = pluggy.HookimplMarker("reef")

# --------------------------------------------------------------------------- config


@hookspec
def reef_config_dir():
    """Return a directory (path or ``pkg://module.path``) of Hydra config groups to add to the search path."""


# --------------------------------------------------------------------------- serve


@hookspec
def register_runtimes(register):
    """Register model runtimes with ``register(name, cls)``; ``cls(config)`` must serve chat requests."""


@hookspec
def register_harness_adapters(register):
    """Register harness install adapters with ``register(name, cls)``; each renders a release tree as an installer."""


# --------------------------------------------------------------------------- observe


@hookspec
def register_record_filters(register):
    """Register record filters with ``register(name, cls)``; each narrows a scenario's experience to what is eligible."""


# --------------------------------------------------------------------------- grow


@hookspec
def register_recipes(register):
    """Register learning recipes with ``register(name, cls)``; each proposes candidates from eligible experience."""


# --------------------------------------------------------------------------- evaluate


@hookspec
def register_evaluators(register):
    """Register evaluators with ``register(name, cls)``; each compares a candidate with the serving release."""


@hookspec
def register_graders(register):
    """Register task graders with ``register(name, fn)``; ``fn(output, task) -> float`` scores one episode."""


# --------------------------------------------------------------------------- publish


@hookspec
def register_artifact_stores(register):
    """Register artifact stores with ``register(name, cls)``; each keeps a scenario's append-only release chain."""


# --------------------------------------------------------------------------- command line


@hookspec
def register_commands(cli):
    """Add commands to the ``reef`` command line: ``cli`` is its click group (``cli.add_command(group)``
    or ``@cli.command()``). Called when the commands are listed or one Reef does not have is named, so
    the hook must stay cheap: import what a command needs inside the command, not in the hook."""


# --------------------------------------------------------------------------- lifecycle


@hookspec
def startup(reef):
    """Called when a kernel starts, after its runtime has started and every scenario's head
    release serves, before the first request. ``reef`` is the ``Reef`` kernel. May return an
    awaitable, which is awaited; an exception fails the start with one line naming the plugin,
    and the plugins started before it are shut down again."""


@hookspec
def shutdown(reef):
    """Called when a kernel stops (and after a failed start, for the plugins whose ``startup``
    ran), in the reverse order of ``startup``, before the runtime closes. May return an awaitable.
    Errors are logged; the shutdown goes on."""


# --------------------------------------------------------------------------- observers


@hookspec
def record_stored(record):
    """Called after an inference record is durable, with an ``ExperienceRecord`` (a frozen copy, not the
    database row); for metrics and integrations, must not block."""


@hookspec
def report_stored(report):
    """Called after a feedback report is durable, with a ``StoredReport`` (frozen); for metrics and
    integrations, must not block."""


@hookspec
def candidate_evaluated(candidate, evaluation, decision):
    """Called after an evaluator has decided on a candidate (selected, rejected, undecided or errored), with copies
    of the ``Candidate`` and ``Evaluation`` (changing them changes nothing in the kernel) and the frozen
    ``Decision``."""


@hookspec
def candidate_skipped(scenario, recipe, reason, kind, counts):
    """Called after a recipe proposed nothing from a batch (the ``skipped`` candidate): its
    ``reason``, the ``kind`` of skip (``reef_core.grow.context.SKIP_KINDS``) and the ``counts`` it
    reported (a dict copy, e.g. ``rollouts_stale``)."""


@hookspec
def release_published(release):
    """Called after a release has been published to the chain and activated in serving, with a
    ``PublishedRelease`` (frozen, not the database row)."""
