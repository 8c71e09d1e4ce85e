"""A server told to stop (SIGTERM, or SIGINT: Ctrl-C) in the middle of a growth step exits without waiting for the
step: a recipe's training is asked to stop and its lineage cannot move any more, a gate's model
call in flight is cut, a recipe that never looks is left behind after ``server.shutdown_timeout_s``;
the candidate is settled at once as an interrupted one and its batch is back in the pool."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from reef_core.store import RecordStore
from reef_core.testing import FakeUpstream
from reef_core.testing.serve_process import free_port

from .conftest import ask, report, wait_for, write_config
from .long_step import LAUNCHER

REPO = Path(__file__).resolve().parents[2]
#: a safety net for a process that no longer waits for the step, far below the step's own 600 s
EXIT_WAIT_S = 60


def _serve(tmp_path: Path, upstream: FakeUpstream, recipe: dict, log: Path) -> tuple[subprocess.Popen, str, Path]:
    cfg = write_config(tmp_path / "reef.yaml", {
        "recipe": {"name": "long_step", "batch_size": 1, "log": str(log), **recipe},
        "evaluator": {"name": "long_gate", "log": str(log)},
        "loop": {"enabled": True, "schedule_s": None},
        "server": {"shutdown_timeout_s": 1},
    })
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    server_log = tmp_path / "serve.log"
    with server_log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, "serve", "-c", str(cfg), f"server.port={port}",
                                 f"server.state_dir={tmp_path / 'state'}", f"runtime.upstream_url={upstream.url}",
                                 "runtime.model=fake-model", "server.log_level=warning"],
                                env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=out)
    return proc, f"http://127.0.0.1:{port}", server_log


# SIGINT (Ctrl-C) is the case that hung: the interpreter joined the step's thread before exiting.
# After a SIGTERM uvicorn re-raises it, which ended the process without settling the candidate.
@pytest.mark.parametrize("recipe,where,sig", [
    ({"mode": "train"}, "stopped", signal.SIGINT),  # a training step that looks at ctx.stopping
    ({"mode": "train"}, "stopped", signal.SIGTERM),
    ({"mode": "train", "deaf": True}, "start", signal.SIGINT),  # one that never looks: left behind after the grace
    ({"mode": "propose"}, "gate", signal.SIGINT),  # the gate, with a model call hanging upstream
], ids=["training", "training-SIGTERM", "deaf-recipe", "gate"])
def test_a_signal_mid_step_exits_and_settles_the_candidate(tmp_path, recipe, where, sig):
    log = tmp_path / "steps.log"
    with FakeUpstream("openai", lambda body: "Paris.") as up:
        proc, url, server_log = _serve(tmp_path, up, recipe, log)
        try:
            with httpx.Client(base_url=url, timeout=30) as client:
                wait_for(lambda: _up(proc, client, server_log), "the server to start", timeout=120)
                receipt = ask(client, "What is the capital of France?").headers["x-reef-agent-record-id"]
                if where == "gate":
                    up.hang(times=None)  # every model call the gate makes waits upstream
                report(client, [receipt], score=0.0, feedback="Answer in one word.")
                wait_for(lambda: log.exists() and ("gate" if where == "gate" else "start") in log.read_text(),
                         "the step to start", timeout=60)
            proc.send_signal(sig)
            proc.wait(EXIT_WAIT_S)  # before the fix: the step's full 600 s (or the gate's timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            up.release()
    tail = server_log.read_text()
    assert proc.returncode in (0, -sig), tail
    assert "Traceback" not in tail, tail
    steps = log.read_text().split("\n")
    if recipe.get("deaf"):
        assert "did not stop within 1s; leaving it behind" in tail
    elif where == "stopped":
        assert "stopped" in steps and "refused StepStopped" in steps and "fenced" not in steps
    else:
        assert any(line.startswith("cancelled ") for line in steps), steps
    store = RecordStore(f"sqlite:///{tmp_path / 'state' / 'reef.db'}")
    try:
        (candidate,) = store.list_candidates("default")
        assert (candidate.status, candidate.decision) == ("error", "error")
        assert "stopped part-way: its process was told to stop" in candidate.reason
        counts = store.counts("default")
        # nothing was proposed (training): the batch is free again; evaluated (gate): it returns
        # to the pool under the return rule, this attempt counted
        assert counts["consumed_reports"] == 0, counts
        assert counts["returned_reports"] == (1 if where == "gate" else 0), counts
    finally:
        store.close()


def _up(proc: subprocess.Popen, client: httpx.Client, server_log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"reef serve exited with {proc.returncode}: {server_log.read_text()}")
    try:
        return client.get("/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
