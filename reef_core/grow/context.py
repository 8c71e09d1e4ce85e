"""What a recipe's ``propose(batch, current_artifact, ctx)`` gets as ``ctx``."""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..commit.artifacts import copy_artifact
from ..commit.gate import EvalContext, EvaluationCancelled
from ..errors import StepStopped
from ..types import ActiveRelease
from .progress import LogProgress

if TYPE_CHECKING:
    from ..kernel import Reef


#: why a recipe proposed nothing, as ``/metrics`` labels it (``RecipeContext.skip``): nothing
#: to learn from (no reward, zero gradient), a warm-up step (the policy did not move), no
#: usable rollout in the batch, every rollout too stale, nothing trains by design, other
SKIP_KINDS = ("nothing_to_learn", "warm_up", "no_usable_rollout", "stale", "not_training", "other")


def eval_context(reef: Reef, scenario: str, progress: Any = None) -> EvalContext:
    """What an evaluator (and a recipe's ``ctx.complete``) calls the runtime through: the
    kernel's runtime and harness application, on the running event loop (call it there)."""
    model = reef.settings.runtime.get("model")
    if not model:
        models = reef.runtime.models()
        model = models[0] if models else None
    return EvalContext(scenario=scenario, runtime=reef.runtime, loop=asyncio.get_running_loop(),
                       apply_harness=reef.releases.apply_harness, log=logging.getLogger("reef.eval"),
                       progress=progress or LogProgress(logging.getLogger("reef.progress"), label=scenario),
                       default_model=model, store=reef.store)


_STOPPED = "the growth step was stopped part-way (its process is stopping)"


@dataclass
class RecipeContext:
    """The services a recipe may use while proposing.

    ``runtime`` is the scenario's runtime (to sample or train), ``store`` the record store,
    ``scratch_dir`` an empty directory removed after the step, ``progress`` a progress
    reporter (``with ctx.progress.task("...", total=n) as bar: bar.advance()``), ``log`` a
    logger, ``current`` the serving release (None before the first), ``options`` the
    recipe's resolved options. A recipe that proposes nothing may say why in ``skip_reason``.
    ``lease`` is the growth lease the step holds (None outside a server's step): a recipe that
    keeps a lineage moves its head only inside ``fence()``, with ``lease_token``.
    ``stopping`` is set when the server stops mid-step: a recipe that runs long looks at it (or
    hands it to reef-train's ``run_steps(..., stop=ctx.stopping)``) and gives up; from then on
    ``complete`` and ``fence`` raise ``StepStopped``, so nothing of the step is kept.
    """

    scenario: str
    recipe: str
    runtime: Any
    store: Any
    scratch_dir: Path
    progress: Any
    log: logging.Logger
    current: ActiveRelease | None
    settings: Any
    _model: EvalContext
    #: why ``propose`` returned None, when the recipe says (the ``skipped`` candidate's reason)
    skip_reason: str | None = None
    #: the kind of skip for ``/metrics`` (one of ``SKIP_KINDS``) and its counts (``skip``)
    skip_kind: str | None = None
    skip_counts: dict[str, int] | None = None
    #: the growth lease the step holds (``reef_core.grow.lease.Holding``), None without one
    lease: Any = None
    #: set when the server is stopping and this step should end now (see the class); in a
    #: server's step it is also the ``cancelled`` event of the context ``complete`` calls through
    stopping: threading.Event = field(default_factory=threading.Event)

    def skip(self, reason: str, kind: str = "other", **counts: int) -> None:
        """Say why ``propose`` returns None: ``reason`` becomes the skipped candidate's reason,
        ``kind`` (one of ``SKIP_KINDS``, else ``other``) labels ``reef_candidates_skipped_total``
        and ``counts`` (e.g. ``rollouts_stale``) are counted on ``/metrics`` too."""
        self.skip_reason = reason
        self.skip_kind = kind if kind in SKIP_KINDS else "other"
        self.skip_counts = {k: int(v) for k, v in counts.items()}

    @property
    def lease_token(self) -> int | None:
        """The fencing token of the step's growth lease (None without one)."""
        return self.lease.token if self.lease is not None else None

    @contextmanager
    def fence(self) -> Iterator[None]:
        """Run the block while the step's growth lease is provably still held with its token
        and cannot change hands (``RecordStore.fenced``); ``LeaseLost`` when it is not. Without
        a lease the block just runs. ``StepStopped`` once the step is stopping."""
        if self.stopping.is_set():
            raise StepStopped(_STOPPED + "; its lineage did not move")
        if self.lease is None or not hasattr(self.store, "fenced"):
            yield
            return
        with self.store.fenced(self.lease.scenario, self.lease.holder, self.lease.token):
            yield

    def complete(self, body: dict[str, Any], release: ActiveRelease | None = None, *,
                 timeout_s: float | None = None) -> dict[str, Any]:
        """Call the scenario's runtime from the recipe's thread (body in ``runtime.dialect``),
        with ``release``'s harness applied when given. Blocks; raises what the runtime raised, and
        ``StepStopped`` once the step is stopping."""
        if self.stopping.is_set():
            raise StepStopped(_STOPPED)
        try:
            return self._model.complete(body, release, timeout_s=timeout_s)
        except EvaluationCancelled:
            raise StepStopped(_STOPPED) from None

    def new_artifact(self, name: str = "artifact") -> Path:
        """A directory in scratch space holding a copy of the current artifact (empty before the
        first release): edit it and return it as ``Candidate.artifact_dir``."""
        dest = self.scratch_dir / name
        if dest.exists():
            shutil.rmtree(dest)
        if self.current is not None and self.current.path is not None:
            return copy_artifact(self.current.path, dest)
        dest.mkdir(parents=True)
        return dest
