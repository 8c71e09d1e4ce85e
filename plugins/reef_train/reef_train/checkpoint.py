"""The learner checkpoint: one on-disk format for every weight recipe's training state.

A checkpoint is a directory laid out like a release artifact, so a candidate *is* a snapshot
of the learner that produced it and a release carries the state its successor resumes::

    adapter/                   the policy's LoRA (a PEFT directory: what serves)
    learner/
      state.json               format reef-learner/1, recipe, counters, recipe state,
                               LoRA shape, whether a critic is saved, the last 50 step metrics
      optimizer.pt             optimizer moments by part: {"policy": ..., "critic": ...}
      critic/                  the critic's LoRA (PEFT directory), when the recipe has one
      value_head.safetensors   the critic's value head, when the recipe has one

``state.json``'s ``recipe_state`` is the recipe's own JSON-able dict (SAO: its ``mode``); a
training step draws no random numbers (LoRA dropout is 0), so weights, moments and counters
are the whole state and a learner loaded from a checkpoint continues exactly as the one that
saved it would have.

``write_atomically`` builds the checkpoint in a temporary directory, fsyncs every file and
directory, and renames it into place: a new (or empty) directory appears complete or not at
all. Into a directory that already holds other files (a candidate's artifact, a copy of the
release it extends) the two parts are renamed in one after the other, ``learner/`` last.

The formats of the recipes' own learners before this one (``reef-sao-learner/1``,
``reef-tttd-learner/1``, same files) are read as this one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "reef-learner/1"
ADAPTER_DIR = "adapter"
LEARNER_DIR = "learner"
STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.pt"
#: step metrics kept in state.json (every candidate's metadata has its own)
HISTORY = 50
#: the recipes' own formats before this one: format -> (recipe, the recipe-state key it recorded)
LEGACY_FORMATS = {"reef-sao-learner/1": ("sao", "mode"), "reef-tttd-learner/1": ("tttd", "variant")}
_LEGACY_KEYS = {"format", "lora", "history", "mode", "variant"}


@dataclass
class LearnerState:
    """What ``learner/state.json`` says."""

    recipe: str
    counters: dict[str, int] = field(default_factory=lambda: {"steps": 0})
    recipe_state: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] = field(default_factory=dict)
    #: whether ``critic/`` and the value head were saved
    critic: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "recipe": self.recipe, "counters": dict(self.counters),
                "recipe_state": dict(self.recipe_state), "lora": dict(self.lora), "critic": self.critic,
                "history": list(self.history)}


def read_learner_state(learner_dir: str | Path | None, recipe: str | None = None) -> LearnerState | None:
    """The state of a ``learner/`` directory; None when there is none, it cannot be read, it has
    another format, or (with ``recipe``) it is another recipe's."""
    if learner_dir is None:
        return None
    try:
        data = json.loads((Path(learner_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    state = _parse(data, Path(learner_dir))
    if state is None or (recipe is not None and state.recipe != recipe):
        return None
    return state


def _parse(data: dict[str, Any], learner_dir: Path) -> LearnerState | None:
    try:
        if data.get("format") == FORMAT:
            return LearnerState(recipe=str(data["recipe"]), counters={k: int(v) for k, v in data["counters"].items()},
                                recipe_state=dict(data.get("recipe_state") or {}), lora=dict(data.get("lora") or {}),
                                critic=bool(data.get("critic")), history=list(data.get("history") or []))
        if data.get("format") in LEGACY_FORMATS:
            recipe, key = LEGACY_FORMATS[data["format"]]
            counters = {k: int(v) for k, v in data.items() if k not in _LEGACY_KEYS and isinstance(v, int)}
            return LearnerState(recipe=recipe, counters=counters,
                                recipe_state={key: data[key]} if key in data else {}, lora=dict(data.get("lora") or {}),
                                critic=(learner_dir / "critic").is_dir(), history=list(data.get("history") or []))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return None


def write_state(learner_dir: Path, state: LearnerState) -> None:
    (learner_dir / STATE_FILE).write_text(json.dumps(state.to_json(), indent=1, sort_keys=True, default=str) + "\n")


def read_optimizers(path: Path, map_location: Any) -> dict[str, Any]:
    """``optimizer.pt`` as ``{part: state_dict}`` (a legacy file: ``actor`` is ``policy``; a bare
    state dict is the policy's)."""
    import torch

    saved = torch.load(str(path), map_location=map_location, weights_only=True)
    if isinstance(saved, dict) and "param_groups" in saved:
        return {"policy": saved}
    saved = dict(saved)
    if "actor" in saved and "policy" not in saved:
        saved["policy"] = saved.pop("actor")
    return saved


def check_moments(optimizer: Any, saved: dict[str, Any]) -> None:
    """Raise ValueError when ``saved`` moments do not have the shapes of ``optimizer``'s
    parameters (``load_state_dict`` does not check them)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    ids = [i for g in saved.get("param_groups", []) for i in g["params"]]
    if len(ids) != len(params):
        raise ValueError(f"{len(ids)} saved parameters for {len(params)}")
    state = saved.get("state", {})
    for i, p in zip(ids, params):
        moments = state.get(i) or state.get(str(i)) or {}
        avg = moments.get("exp_avg")
        if avg is not None and tuple(avg.shape) != tuple(p.shape):
            raise ValueError(f"a moment of shape {tuple(avg.shape)} for a parameter of shape {tuple(p.shape)}")


# ---------------------------------------------------------------------- atomic directories


def write_atomically(directory: str | Path, write: Callable[[Path], None]) -> Path:
    """Fill a temporary directory with ``write(tmp)``, fsync it, and rename it to ``directory``
    (new or empty: one atomic rename), or rename its entries into ``directory`` (which already
    holds other files: one rename per entry, in sorted order, replacing what was there).
    Returns ``directory``. On an error nothing of the temporary directory is left."""
    directory = Path(directory)
    fresh = not directory.exists() or (directory.is_dir() and not any(directory.iterdir()))
    parent = directory.parent if fresh else directory
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{directory.name}-" if fresh else ".tmp-checkpoint-", dir=parent))
    try:
        write(tmp)
        _fsync_tree(tmp)
        if fresh:
            os.replace(tmp, directory)
        else:
            for entry in sorted(p for p in tmp.iterdir() if not p.name.startswith(".old-")):
                target = directory / entry.name
                if target.exists() or target.is_symlink():
                    os.replace(target, tmp / f".old-{entry.name}")
                os.replace(entry, target)
        _fsync_dir(parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
