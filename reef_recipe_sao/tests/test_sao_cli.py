"""The recipe through the ``reef`` command: listed by ``reef plugins``; configuration errors
and a runtime training cannot reach are one line and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys


def _reef(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("REEF_PLUGINS", "REEF_UPSTREAM_URL")}
    return subprocess.run([sys.executable, "-m", "reef_core", *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_reef_plugins_lists_sao(tmp_path):
    result = _reef(tmp_path, "plugins")
    assert result.returncode == 0, result.stderr
    assert "recipe: sao" in next(ln for ln in result.stdout.splitlines() if ln.startswith("sao "))


def test_a_misspelt_option_is_one_line(tmp_path):
    line = _one_error_line(_reef(tmp_path, "serve", "recipe=sao", "+recipe.bach_size=4"))
    assert "recipe.bach_size" in line


def test_the_gate_needs_held_out_tasks(tmp_path):
    line = _one_error_line(_reef(tmp_path, "serve", "recipe=sao"))
    assert "evaluator.tasks" in line


def test_a_runtime_without_token_capture_is_refused_at_start(tmp_path):
    # six tasks: a smaller suite adds its own start-up warning (it could never select), not this test's subject
    tasks = ", ".join(f"{{prompt: hi{i}, expected: hi}}" for i in range(6))
    line = _one_error_line(_reef(tmp_path, "serve", "recipe=sao", f"+evaluator.tasks=[{tasks}]",
                                 "runtime.upstream_url=http://127.0.0.1:9", "server.port=0",
                                 f"server.state_dir={tmp_path / 'state'}"))
    assert "recipe 'sao'" in line and "runtime=upstream" in line
