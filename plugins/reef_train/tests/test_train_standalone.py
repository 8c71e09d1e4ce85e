"""reef-train stands alone: its package and its tests run with reef-torch and reef-core made
unimportable and no third-party pytest plugin loaded (only reef-train's own fixtures, named
with ``-p``), as after ``pip install reef-train``. They run in this run's tier: the ``-m``
expression this run was given (scripts/test's ``not slow`` leaves out the Ray training runs,
``--all`` runs them there too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
BLOCKED = ("reef_torch", "reef_core")

SHIM = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # any import of it (or of a submodule) raises ImportError
for name in {blocked!r}:
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"blocking {{name}} did not work")
import pkgutil, reef_train
for mod in pkgutil.walk_packages(reef_train.__path__, "reef_train."):
    __import__(mod.name)
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def standalone_args(tmp_path: Path, markexpr: str) -> list[str]:
    """pytest's arguments for reef-train's tests alone, in the tier ``markexpr`` selects."""
    # none of the repository's pytest config or conftest.py; reef-train's own tier marker
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: a learning run (Ray training)\n")
    tier = ["-m", markexpr] if markexpr else []
    return ["-c", str(tmp_path / "pytest.ini"), "--rootdir", str(TESTS), "--confcutdir", str(TESTS),
            "-p", "no:cacheprovider", "-p", "reef_train.pytest_plugin", "--strict-markers", "-q",
            "--basetemp", str(tmp_path / "tmp"), *tier, "--deselect", Path(__file__).name, str(TESTS)]


def test_package_and_tests_run_without_reef_torch_or_reef_core(tmp_path, request):
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    args = standalone_args(tmp_path, request.config.option.markexpr)
    proc = subprocess.run([sys.executable, "-c", SHIM.format(blocked=BLOCKED), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert " passed" in out and "deselected" in out, out


def test_the_standalone_run_keeps_this_runs_tier(tmp_path):
    """Under scripts/test's ``-m "not slow"`` the standalone run leaves out the Ray training runs
    (the slow tier runs them), and it knows the ``slow`` marker (no unknown-marker error)."""
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", *standalone_args(tmp_path, "not slow")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    collected = {line.split("::", 1)[1].split("[")[0] for line in out.splitlines() if ".py::" in line}
    assert "test_train_step_runs_through_a_backend_into_an_artifact" in collected, out
    assert not collected & RAY_TRAINING_RUNS, out


#: reef-train's tests marked slow (tests/test_ray_backend.py)
RAY_TRAINING_RUNS = {"test_a_step_runs_as_a_ray_task_and_its_adapter_comes_back",
                     "test_failing_dying_and_overlong_steps_are_trainer_errors"}
