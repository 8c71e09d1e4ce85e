"""The ``ray`` trainer backend: a training step as one Ray task (install ``reef-train[ray]``).

See ``reef_train.backend`` for the step contract and the fail-closed rule. The worker runs
the same function a local step would, so a cluster's workers need the recipe's packages
installed (the same image, or a Ray ``runtime_env`` set up when the cluster starts).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .backend import Trainer, TrainerError, TrainerOptions, TrainStep, pack_dir, run_shipped, unpack_dir
from .stopping import Stopped

log = logging.getLogger("reef.train")

_connect_lock = threading.Lock()
#: how often a wait for a Ray task looks at the caller's stop event (seconds)
STOP_POLL_S = 0.25


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise TrainerError("trainer.backend=ray needs Ray: pip install 'reef-train[ray]'") from None
    return ray


def _run_shared(fn: TrainStep, payload: Any, inputs: Mapping[str, str | None], output: str) -> tuple[Any, None]:
    """On the worker, with shared storage: the driver's paths are valid here."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    return fn(payload, {k: None if v is None else Path(v) for k, v in inputs.items()}, out), None


def _probe(address: str | None, timeout_s: float = 5.0) -> None:
    """Fail fast on a ``host:port`` (or ``ray://host:port``) nobody listens on: ``ray.init``
    itself keeps retrying such an address for minutes before it gives up."""
    if not address or address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise TrainerError(f"cannot connect to the Ray cluster at {address}: {exc}") from None


class RayTrainer(Trainer):
    """Submits each step to the Ray cluster at ``options.address`` and waits for it."""

    def __init__(self, options: TrainerOptions):
        super().__init__(options)
        self.ray = _ray()

    def connect(self) -> None:
        """Join the cluster once per process (a process already connected keeps its connection)."""
        ray = self.ray
        with _connect_lock:
            if ray.is_initialized():
                return
            _probe(self.options.address)
            try:
                ray.init(address=self.options.address, ignore_reinit_error=True, include_dashboard=False,
                         logging_level=logging.WARNING)
            except Exception as exc:  # ConnectionError, RuntimeError, ValueError: all mean no cluster
                raise TrainerError(f"cannot connect to the Ray cluster at {self.options.address or 'the default address'}: "
                                   f"{type(exc).__name__}: {exc}") from exc

    def run(self, fn: TrainStep, payload: Any, *, inputs: Mapping[str, str | Path | None], output: str | Path,
            stop: threading.Event | None = None) -> Any:
        ray, opts = self.ray, self.options
        self.connect()
        out = Path(output)
        task_options: dict[str, Any] = {"num_cpus": opts.num_cpus, "num_gpus": opts.num_gpus,
                                        "max_retries": opts.max_retries, "retry_exceptions": False,
                                        "name": f"reef-train:{getattr(fn, '__qualname__', 'step')}"}
        if opts.memory_mb is not None:
            task_options["memory"] = opts.memory_mb * 1024 * 1024
        if opts.shared_storage:
            task = ray.remote(_run_shared).options(**task_options)
            ref = task.remote(fn, payload, {k: None if v is None else str(Path(v).resolve()) for k, v in inputs.items()},
                              str(out.resolve()))
        else:
            shipped = {k: None if v is None else pack_dir(v) for k, v in inputs.items()}
            ref = ray.remote(run_shipped).options(**task_options).remote(fn, payload, shipped)
        result, archive = self._wait(ref, stop)
        if archive is not None:
            unpack_dir(archive, out)
        else:
            out.mkdir(parents=True, exist_ok=True)
        return result

    def _wait(self, ref: Any, stop: threading.Event | None = None) -> Any:
        """The task's value; every way it can fail on the cluster as a ``TrainerError``; once
        ``stop`` is set the task is cancelled and ``Stopped`` raised."""
        ray, opts = self.ray, self.options
        errors = ray.exceptions
        deadline = time.monotonic() + opts.timeout_s
        try:
            while stop is not None:  # wait in slices, to see the stop
                left = deadline - time.monotonic()
                ready, _ = ray.wait([ref], timeout=max(min(STOP_POLL_S, left), 0.0))
                if ready or left <= 0:
                    break
                if stop.is_set():
                    ray.cancel(ref, force=True)
                    raise Stopped("the training step was stopped before it finished (its process is stopping); "
                                  "its Ray task was cancelled and nothing of it was saved")
            return ray.get(ref, timeout=max(deadline - time.monotonic(), 0.0))
        except errors.GetTimeoutError:
            ray.cancel(ref, force=True)
            raise TrainerError(f"the training step did not finish within trainer.timeout_s={opts.timeout_s:g} s "
                               "on Ray (queued or running); it was cancelled and nothing was published") from None
        except errors.RayTaskError as exc:  # the step itself raised: its own error, as the worker saw it
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            raise TrainerError(f"the training step failed on Ray: {type(cause).__name__}: {_line(cause)}") from exc
        except (errors.WorkerCrashedError, errors.NodeDiedError, errors.LocalRayletDiedError,
                errors.TaskCancelledError) as exc:
            raise TrainerError(f"the training step was lost on Ray ({type(exc).__name__}: its worker or node died "
                               f"or it was cancelled; max_retries={opts.max_retries}); nothing was published") from exc
        except (errors.ObjectLostError, errors.OwnerDiedError, errors.ObjectStoreFullError, errors.OutOfMemoryError,
                errors.TaskUnschedulableError, errors.RuntimeEnvSetupError, errors.RaySystemError) as exc:
            raise TrainerError(f"the training step could not complete on Ray: {type(exc).__name__}: {_line(exc)}") from exc
        except errors.RayError as exc:
            raise TrainerError(f"the training step failed on Ray: {type(exc).__name__}: {_line(exc)}") from exc


def _line(exc: BaseException) -> str:
    """The first line of ``exc``'s message: Ray appends the worker's whole traceback to some
    (it is in the worker's log; the candidate's reason stays one sentence)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
