"""reef-train stands alone: its package and its tests run with reef-torch and reef-core made
unimportable and no third-party pytest plugin loaded (only reef-train's own fixtures, named
with ``-p``), as after ``pip install reef-train``. The default tier checks that every module
imports and every test finds its fixtures that way; the slow tier (``--all``) runs the tests
standalone too, in that run's tier."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def _standalone(tmp_path: Path, *args: str) -> str:
    """pytest run by :data:`SHIM` (reef-torch and reef-core blocked, every reef_train module
    imported first) with ``args``; its output, asserted to have exited 0."""
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", SHIM.format(blocked=BLOCKED), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def test_package_imports_and_its_tests_find_their_fixtures_without_reef_torch_or_reef_core(tmp_path):
    """The default tier's standalone check: every module imports, and every test of this tier
    collects and finds its fixtures (``--setup-plan`` resolves them without running them; a
    fixture that only the repository's conftest.py has is an error here) with reef-core blocked.
    Under ``-m "not slow"`` the Ray training runs are left out and the ``slow`` marker is known
    (no unknown-marker error). Running the tests themselves standalone is the slow tier's (below):
    the default run already runs each of them once, with the repository's fixtures."""
    out = _standalone(tmp_path, "--setup-plan", *standalone_args(tmp_path, "not slow"))
    planned = {line.split("::", 1)[1].split("[")[0].split()[0] for line in out.splitlines() if ".py::" in line}
    assert "test_train_step_runs_through_a_backend_into_an_artifact" in planned, out
    assert not planned & RAY_TRAINING_RUNS, out
    assert " deselected" in out and " error" not in out, out


@pytest.mark.slow
def test_package_and_tests_run_without_reef_torch_or_reef_core(tmp_path, request):
    """reef-train's whole suite in this run's tier, standalone (its tests already ran in the
    default tier with the repository's fixtures; this is the second run that proves they pass
    as after ``pip install reef-train``)."""
    out = _standalone(tmp_path, *standalone_args(tmp_path, request.config.option.markexpr))
    assert " passed" in out and "deselected" in out, out


#: reef-train's tests marked slow (tests/test_ray_backend.py)
RAY_TRAINING_RUNS = {"test_a_step_runs_as_a_ray_task_and_its_adapter_comes_back",
                     "test_failing_dying_and_overlong_steps_are_trainer_errors"}
