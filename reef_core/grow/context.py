"""What a recipe's ``propose(batch, current_artifact, ctx)`` gets as ``ctx``."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..commit.artifacts import copy_artifact
from ..commit.gate import EvalContext
from ..types import ActiveRelease


@dataclass
class RecipeContext:
    """The services a recipe may use while proposing.

    ``runtime`` is the scenario's runtime (to sample or train), ``store`` the record store,
    ``scratch_dir`` an empty directory removed after the step, ``progress`` a progress
    reporter (``with ctx.progress.task("...", total=n) as bar: bar.advance()``), ``log`` a
    logger, ``current`` the serving release (None before the first), ``options`` the
    recipe's resolved options.
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

    def complete(self, body: dict[str, Any], release: ActiveRelease | None = None, *,
                 timeout_s: float | None = None) -> dict[str, Any]:
        """Call the scenario's runtime from the recipe's thread (body in ``runtime.dialect``),
        with ``release``'s harness applied when given. Blocks; raises what the runtime raised."""
        return self._model.complete(body, release, timeout_s=timeout_s)

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
