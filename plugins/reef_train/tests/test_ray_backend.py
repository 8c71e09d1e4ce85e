"""Trainer backends: options, the local backend, and training steps as Ray tasks on a local
Ray instance (the adapter comes back; a failing, dying or overlong step is a TrainerError)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from reef_train import LocalTrainer, Stopped, TrainerError, TrainerOptions, make_trainer
from reef_train.backend import SCRATCH_PREFIX, pack_dir, remove_orphaned_scratch, run_shipped, unpack_dir
from reef_train.testing import word_adapter_step

PAYLOAD = {"word": "mango", "prompts": ["fruit?", "name one"], "steps": 3}


def test_options_are_checked_with_every_problem_named():
    assert make_trainer(None).options == TrainerOptions()
    assert isinstance(make_trainer({"backend": "local"}), LocalTrainer)
    with pytest.raises(ValueError, match=r"trainer.gpus is not an option.*num_gpus"):
        TrainerOptions.from_config({"backend": "ray", "gpus": 1})
    with pytest.raises(ValueError, match="trainer.backend must be one of local, ray, not 'slurm'"):
        TrainerOptions.from_config({"backend": "slurm"})
    with pytest.raises(ValueError, match="num_gpus must be 0 or more.*timeout_s must be above 0"):
        TrainerOptions.from_config({"num_gpus": -1, "timeout_s": 0})
    with pytest.raises(ValueError, match="trainer options"):
        TrainerOptions.from_config({"num_cpus": "many"})
    opts = TrainerOptions.from_config({"backend": "ray", "address": "auto", "num_gpus": 1, "timeout_s": "60"})
    assert (opts.backend, opts.address, opts.num_gpus, opts.timeout_s) == ("ray", "auto", 1.0, 60.0)


def test_archives_round_trip_and_refuse_escaping_paths(tmp_path):
    (tmp_path / "src" / "adapter").mkdir(parents=True)
    (tmp_path / "src" / "adapter" / "w.safetensors").write_bytes(bytes(range(256)))
    out = unpack_dir(pack_dir(tmp_path / "src"), tmp_path / "dst")
    assert (out / "adapter" / "w.safetensors").read_bytes() == bytes(range(256))
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        unpack_dir(buf.getvalue(), tmp_path / "evil")
    assert not (tmp_path / "escape.txt").exists()


@pytest.mark.skipif(os.name != "posix", reason="process liveness by signal 0")
def test_a_step_removes_the_scratch_that_killed_workers_left(tmp_path, monkeypatch):
    """A step cancelled on its timeout or a worker killed mid-step never cleans its scratch (the
    unpacked inputs, a base model among them); the next step on that machine removes every
    scratch of a process that is gone, and leaves those of live ones and anything else."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = tmp_path / f"{SCRATCH_PREFIX}{ended.pid}-abc"
        running = tmp_path / f"{SCRATCH_PREFIX}{live.pid}-def"
        other = tmp_path / "reef-train-steps-of-someone"
        for d in (dead, running, other):
            (d / "inputs" / "base").mkdir(parents=True)
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        assert run_shipped(lambda payload, inputs, out: payload, 5, {})[0] == 5
        assert not dead.exists() and running.is_dir() and other.is_dir()
        assert not list(tmp_path.glob(f"{SCRATCH_PREFIX}{os.getpid()}-*")), "the step's own scratch is removed"
        assert remove_orphaned_scratch(tmp_path) == []
    finally:
        live.kill()
        live.wait()
    assert remove_orphaned_scratch(tmp_path) == [running]


def test_the_local_backend_runs_the_step_in_process(tiny_model_dir, tmp_path):
    metrics = make_trainer(None).run(word_adapter_step, PAYLOAD, inputs={"base": tiny_model_dir, "adapter": None},
                                     output=tmp_path / "out")
    assert metrics["pid"] == os.getpid() and metrics["steps"] == 3
    assert (tmp_path / "out" / "adapter" / "adapter_config.json").is_file()


# ---------------------------------------------------------------------- on a local Ray instance

try:
    import ray
except ImportError:
    ray = None
needs_ray = pytest.mark.skipif(ray is None, reason="Ray is not installed (pip install 'reef-train[ray]')")


@needs_ray
def test_an_unreachable_cluster_is_a_trainer_error(tmp_path):
    if ray.is_initialized():
        pytest.skip("this process is already connected to a Ray instance")
    trainer = make_trainer({"backend": "ray", "address": "127.0.0.1:9", "timeout_s": 5})
    with pytest.raises(TrainerError, match="cannot connect to the Ray cluster at 127.0.0.1:9"):
        trainer.run(_raises, 1, inputs={}, output=tmp_path / "x")
    assert not ray.is_initialized()


@pytest.fixture(scope="module")
def ray_cluster():
    import sys

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    # the failing steps below live in this test module, which workers cannot import by name
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


def _raises(payload, inputs, output):
    raise ValueError(f"bad batch {payload}")


def _dies(payload, inputs, output):
    os.kill(os.getpid(), signal.SIGKILL)


def _sleeps(payload, inputs, output):
    time.sleep(payload)


@needs_ray
@pytest.mark.slow
def test_a_step_runs_as_a_ray_task_and_its_adapter_comes_back(ray_cluster, tiny_model_dir, tmp_path):
    from reef_train import load_policy

    trainer = make_trainer({"backend": "ray", "num_cpus": 1, "timeout_s": 300})
    first = trainer.run(word_adapter_step, PAYLOAD, inputs={"base": tiny_model_dir, "adapter": None},
                        output=tmp_path / "one")
    assert first["pid"] != os.getpid(), "the step must run in a Ray worker, not in this process"
    adapter = tmp_path / "one" / "adapter"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    load_policy(tiny_model_dir, adapter, r=8, alpha=16, include_lm_head=True)  # a loadable PEFT adapter
    # continuing from that adapter, with inputs and output as shared paths instead of archives
    shared = make_trainer({"backend": "ray", "shared_storage": True, "timeout_s": 300})
    second = shared.run(word_adapter_step, PAYLOAD, inputs={"base": tiny_model_dir, "adapter": adapter},
                        output=tmp_path / "two")
    assert second["pid"] != os.getpid() and second["loss"] < first["loss"]
    assert (tmp_path / "two" / "adapter" / "adapter_model.safetensors").is_file()


@needs_ray
@pytest.mark.slow
def test_failing_dying_and_overlong_steps_are_trainer_errors(ray_cluster, tmp_path):
    trainer = make_trainer({"backend": "ray", "timeout_s": 120})
    with pytest.raises(TrainerError, match="failed on Ray: ValueError: bad batch 7"):
        trainer.run(_raises, 7, inputs={}, output=tmp_path / "a")
    with pytest.raises(TrainerError, match="lost on Ray.*WorkerCrashedError"):
        trainer.run(_dies, None, inputs={}, output=tmp_path / "b")
    with pytest.raises(TrainerError, match="did not finish within trainer.timeout_s=1 s"):
        make_trainer({"backend": "ray", "timeout_s": 1}).run(_sleeps, 60, inputs={}, output=tmp_path / "c")
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists(), "a lost step writes no output"
    # a stop (the server is stopping) cancels the task at once; a stop never set leaves the timeout as it was
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    with pytest.raises(Stopped, match="Ray task was cancelled"):  # raised only while the task still runs
        trainer.run(_sleeps, 60, inputs={}, output=tmp_path / "e", stop=stop)
    assert not (tmp_path / "e").exists()
    with pytest.raises(TrainerError, match="did not finish within trainer.timeout_s=1 s"):
        make_trainer({"backend": "ray", "timeout_s": 1}).run(_sleeps, 60, inputs={}, output=tmp_path / "f",
                                                             stop=threading.Event())
    # the cluster is still usable afterwards, and its step removed the scratch the killed workers left
    assert trainer.run(lambda p, i, o: p + 1, 1, inputs={}, output=tmp_path / "d") == 2
    assert remove_orphaned_scratch() == []

