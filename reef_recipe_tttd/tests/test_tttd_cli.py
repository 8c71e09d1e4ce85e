"""``reef tttd``: the package's commands on ``reef`` (its ``register_commands`` hook), and the same
commands under ``python -m reef_recipe_tttd``. Run as a user runs them, in a fresh process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from reef_core.testing import ReefServer


def _run(*argv: str, module: str = "reef_core", cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "REEF_PLUGINS"}
    return subprocess.run([sys.executable, "-m", module, *argv], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reef_lists_the_tttd_commands_and_the_module_runs_the_same():
    helped = _run("--help")
    assert helped.returncode == 0 and "tttd" in helped.stdout
    listed = _run("tttd", "tasks")
    assert listed.returncode == 0, listed.stderr
    assert [line.split(":")[0] for line in listed.stdout.splitlines()] == ["circles<k>", "circles<k>-program",
                                                                            "spread<k>"]
    alias = _run("tasks", module="reef_recipe_tttd")
    assert alias.returncode == 0 and alias.stdout == listed.stdout


def test_mistakes_are_one_line_with_the_usual_exit_codes():
    task = _run("tttd", "run", "nosuch")
    assert task.returncode == 2 and "no task named 'nosuch'" in task.stderr and "Traceback" not in task.stderr
    executor = _run("tttd", "run", "spread3", "--guidance", "--executor-url", "http://127.0.0.1:9/v1")
    assert executor.returncode == 2 and "--executor-url needs --executor-model" in executor.stderr
    url = f"http://127.0.0.1:{_closed_port()}"
    down = _run("tttd", "run", "spread3", "--url", url, "--groups", "1", "--rollouts", "2")
    assert down.returncode == 1 and "Traceback" not in down.stderr
    assert down.stderr.strip().splitlines()[-1].startswith(f"Error: cannot reach the Reef server at {url}")


def test_reef_tttd_run_commits_a_step_against_a_real_server(tmp_path, tiny_model_dir):
    with ReefServer(tmp_path / "state", ["runtime=local", f"runtime.model={tiny_model_dir}", "recipe=tttd",
                                         "recipe.groups_per_step=2", "recipe.rollouts_per_group=2",
                                         "recipe.lora_rank=4", "recipe.lora_alpha=8", "evaluator=always",
                                         "server.default_scenario=disc"]) as reef:
        # the test double whose every answer scores differently, so the step has something to learn
        done = _run("tttd", "run", "reef_recipe_tttd.testing:ChecksumTask", "--url", reef.url, "--scenario", "disc",
                    "--groups", "2",
                    "--rollouts", "2", "--max-tokens", "6", "--steps", "1", "--run-dir", str(tmp_path / "run"),
                    cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["steps"] == 1 and out["history"][0]["committed_release"]
        assert reef.store.head_release("disc").release_id == out["history"][0]["committed_release"]
