"""reef-core's wheel carries the dashboard: templates, stylesheet, the vendored htmx and its
license (nothing is built or fetched at install time)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from reef_core.ui.rendering import HERE, HTMX
from tests.test_wheels import ROOT, _copy_sources, _env


def test_the_core_wheel_ships_the_dashboard(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("the wheel is built from git's file list: not a git checkout")
    src = tmp_path / "src"
    _copy_sources(".", src)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path / "dist"), str(src)],
                           cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # setuptools says nothing about the dashboard's data directories (not packages, not data files)
    warned = [line for line in (built.stdout + built.stderr).splitlines()
              if "warn" in line.lower() and ("reef_core.ui" in line or "reef_core/ui" in line)]
    assert warned == []
    wheel = next((tmp_path / "dist").glob("reef_core-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"reef_core/ui/{p.relative_to(HERE)}" for p in HERE.rglob("*")
                if p.is_file() and p.suffix in (".html", ".css", ".js", ".txt")}
    assert f"reef_core/ui/static/{HTMX}" in expected and "reef_core/ui/templates/scenario.html" in expected
    assert any(n.endswith(".LICENSE.txt") for n in expected)
    assert expected <= names, sorted(expected - names)
