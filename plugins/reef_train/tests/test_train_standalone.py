"""reef-train stands alone: its package and its tests run with reef-torch and reef-core made
unimportable and no third-party pytest plugin loaded (only reef-train's own fixtures, named
with ``-p``), as after ``pip install reef-train``."""

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


def test_package_and_tests_run_without_reef_torch_or_reef_core(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # none of the repository's pytest config or conftest.py
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    args = ["-c", str(tmp_path / "pytest.ini"), "--rootdir", str(TESTS), "--confcutdir", str(TESTS),
            "-p", "no:cacheprovider", "-p", "reef_train.pytest_plugin", "-q", "--basetemp", str(tmp_path / "tmp"),
            "--deselect", Path(__file__).name, str(TESTS)]
    proc = subprocess.run([sys.executable, "-c", SHIM.format(blocked=BLOCKED), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert " passed" in out and "deselected" in out, out
