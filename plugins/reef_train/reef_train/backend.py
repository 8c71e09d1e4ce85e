"""Trainer backends: where a weight recipe's training step runs.

A recipe writes its step as one plain function::

    def train_step(payload, inputs: dict[str, Path | None], output: Path) -> metrics

``payload`` is whatever the step needs that is not a directory (the batch, the options; it
must pickle), ``inputs`` names the directories it reads (the base model, the adapter it
continues from), ``output`` is the empty directory it writes the candidate's ``adapter/`` (and
any state) into; it returns small, picklable metrics. The function must be importable by
name (a module-level function of an installed package), so a remote worker can load it.
``base_input(inputs, recipe, device=...)`` reads its ``base`` input as a ``WorkerBase``, the
served base ``load_trainable`` takes.

``make_trainer(options)`` picks where it runs, from the recipe's ``trainer`` option:

* ``local`` (the default): in this process, as a plain call;
* ``ray``: as one Ray task (``ray.init(address=...)``) with the resources the options ask
  for (``num_cpus``, ``num_gpus``, ``memory_mb``). The input directories travel through the
  object store as tar archives and the output comes back the same way, unless
  ``shared_storage`` says every node sees the same paths (a base model on a shared volume:
  then only paths travel).

The Ray backend fails closed: a step that raises, a worker or node that dies, a lost object,
a cluster that cannot be reached or a step that outlives ``timeout_s`` (it is then cancelled)
is a ``TrainerError`` naming what happened. The recipe lets it propagate, so the growth step
ends in ``error`` with that sentence and nothing is published; the server keeps serving.
Tasks are not retried (``max_retries`` 0) unless the options say so: a retry would silently
double the work of a step that ran long before dying.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tarfile
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .stopping import stop_on

log = logging.getLogger("reef.train")

BACKENDS = ("local", "ray")

#: what a training step function looks like (see the module docstring)
TrainStep = Callable[[Any, dict[str, "Path | None"], Path], Any]


class TrainerError(RuntimeError):
    """The training step failed or was lost on its backend: the candidate fails, nothing is
    published, the server carries on."""


@dataclass(frozen=True)
class WorkerBase:
    """The served base model as a training step sees it where it runs: ``path`` is its
    directory there (``inputs["base"]``, unpacked on a Ray worker), ``device`` where training
    goes (``auto`` on a remote worker, whose devices are its own). Duck-types the
    ``reef_core.ServedBase`` that ``load_trainable`` / ``load_tokenizer`` read (``path``,
    ``device``), so a step function needs no runtime."""

    path: Path
    device: str | None = "auto"


def base_input(inputs: Mapping[str, str | Path | None], recipe: str, *, device: str | None = "auto") -> WorkerBase:
    """The ``base`` input of a training step as a ``WorkerBase`` on ``device``. ValueError names
    the ``recipe`` when the trainer was given no base model directory."""
    base_dir = inputs.get("base")
    if base_dir is None:
        raise ValueError(f"the {recipe} step needs the base model directory (inputs['base'])")
    return WorkerBase(path=Path(base_dir), device=device)


@dataclass(frozen=True)
class TrainerOptions:
    """The ``trainer`` option of a weight recipe (a mapping in the config)."""

    #: ``local`` (in this process) or ``ray``
    backend: str = "local"
    #: the Ray cluster (``ray.init(address=...)``: ``auto``, ``ray://host:10001``, ``host:6379``);
    #: None: the Ray instance this process is connected to, else Ray's own default
    #: (``RAY_ADDRESS``, a cluster on this machine, or a new local instance)
    address: str | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    #: memory the task reserves (Ray's ``memory`` resource), None: no reservation
    memory_mb: int | None = None
    #: seconds the step may take on the cluster, queueing included, before it is cancelled
    timeout_s: float = 3600.0
    #: every node sees the driver's paths (inputs and output travel as paths, not archives)
    shared_storage: bool = False
    #: Ray retries of a task whose worker died (0: a lost worker fails the candidate at once)
    max_retries: int = 0

    @classmethod
    def from_config(cls, value: TrainerOptions | Mapping[str, Any] | None) -> TrainerOptions:
        """Options from a recipe's ``trainer`` mapping (None: local). ValueError names every
        problem: unknown keys, an unknown backend, resources out of range."""
        if isinstance(value, TrainerOptions):
            return value
        value = dict(value or {})
        known = {f.name for f in fields(cls)}
        problems = [f"trainer.{k} is not an option (use {', '.join(sorted(known))})" for k in value if k not in known]
        if problems:
            raise ValueError("; ".join(problems))
        try:
            opts = cls(**value)
            opts = cls(backend=str(opts.backend), address=None if opts.address in (None, "") else str(opts.address),
                       num_cpus=float(opts.num_cpus), num_gpus=float(opts.num_gpus),
                       memory_mb=None if opts.memory_mb is None else int(opts.memory_mb),
                       timeout_s=float(opts.timeout_s), shared_storage=bool(opts.shared_storage),
                       max_retries=int(opts.max_retries))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"trainer options: {exc}") from None
        if opts.backend not in BACKENDS:
            problems.append(f"trainer.backend must be one of {', '.join(BACKENDS)}, not {opts.backend!r}")
        if opts.num_cpus < 0 or opts.num_gpus < 0 or (opts.memory_mb is not None and opts.memory_mb <= 0):
            problems.append("trainer.num_cpus and trainer.num_gpus must be 0 or more, trainer.memory_mb above 0")
        if opts.timeout_s <= 0 or opts.max_retries < 0:
            problems.append("trainer.timeout_s must be above 0 and trainer.max_retries 0 or more")
        if problems:
            raise ValueError("; ".join(problems))
        return opts


class Trainer(ABC):
    """Runs training steps; ``make_trainer`` builds the one the options name."""

    def __init__(self, options: TrainerOptions):
        self.options = options

    @abstractmethod
    def run(self, fn: TrainStep, payload: Any, *, inputs: Mapping[str, str | Path | None], output: str | Path,
            stop: threading.Event | None = None) -> Any:
        """Run ``fn(payload, inputs, output)``; ``output`` (created empty when missing) holds
        what it wrote once this returns. Returns ``fn``'s result. Raises ``TrainerError`` when
        the backend lost the step, whatever ``fn`` raised when it runs here, and
        ``reef_train.Stopped`` when ``stop`` was set before the step finished."""


class LocalTrainer(Trainer):
    """The step in this process: a plain call (what every recipe did before backends)."""

    def run(self, fn: TrainStep, payload: Any, *, inputs: Mapping[str, str | Path | None], output: str | Path,
            stop: threading.Event | None = None) -> Any:
        out = Path(output)
        out.mkdir(parents=True, exist_ok=True)
        with stop_on(stop):  # the step checks it between optimizer steps (reef_train.stopping)
            return fn(payload, {k: None if v is None else Path(v) for k, v in inputs.items()}, out)


def make_trainer(options: TrainerOptions | Mapping[str, Any] | None = None) -> Trainer:
    """The trainer the recipe's ``trainer`` option names (None or ``{}``: local)."""
    opts = TrainerOptions.from_config(options)
    if opts.backend == "ray":
        from .ray_backend import RayTrainer

        return RayTrainer(opts)
    return LocalTrainer(opts)


# ---------------------------------------------------------------------- directory archives

def pack_dir(path: str | Path) -> bytes:
    """The directory ``path`` as an uncompressed tar archive (weights do not compress)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(path), arcname=".")
    return buf.getvalue()


def unpack_dir(data: bytes, dest: str | Path) -> Path:
    """Extract an archive of ``pack_dir`` into ``dest`` (created); links and paths that leave
    ``dest`` are refused (tarfile's ``data`` filter)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(str(dest), filter="data")
    return dest


SCRATCH_PREFIX = "reef-train-step-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_orphaned_scratch(root: str | Path | None = None) -> list[Path]:
    """Remove the scratch directories under ``root`` (the temporary directory) of workers that
    are gone; the removed paths. A step cancelled on ``timeout_s`` or a worker killed mid-step
    never reaches its own clean-up, and its scratch holds the unpacked inputs (the base model,
    unless ``shared_storage``). A directory is named for the process that made it; one whose
    process still runs is left alone (Ray's workers on a node share its process namespace, so a
    number that names no process is one that ended). Not on Windows, where there is no signal 0."""
    if os.name != "posix":
        return []
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"):
        pid = path.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        log.info("removed %d scratch director%s of training steps whose worker is gone",
                 len(removed), "y" if len(removed) == 1 else "ies")
    return removed


def run_shipped(fn: TrainStep, payload: Any, inputs: Mapping[str, bytes | None]) -> tuple[Any, bytes]:
    """On the worker: unpack ``inputs`` into a scratch directory, run the step there, return
    (its result, the output directory as an archive). The scratch directory is removed, and so
    are those earlier steps left behind when their worker was killed (``remove_orphaned_scratch``)."""
    remove_orphaned_scratch()
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
    try:
        local = {name: None if data is None else unpack_dir(data, scratch / "inputs" / name)
                 for name, data in inputs.items()}
        out = scratch / "output"
        out.mkdir()
        result = fn(payload, local, out)
        return result, pack_dir(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
