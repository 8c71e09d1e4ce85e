"""reef-core's wheel carries the dashboard: templates, stylesheet, the vendored htmx and its
license (nothing is built or fetched at install time)."""

from __future__ import annotations

import re
import zipfile

import pytest

from reef_core.ui.rendering import HERE, HTMX

# the wheel is the one tests/test_wheels.py installs, built once per run (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("wheels")


def test_the_core_wheel_ships_the_dashboard(wheelhouse):
    # setuptools says nothing about the dashboard's data directories (not packages, not data files)
    warned = [line for line in wheelhouse["logs"]["reef-core"].splitlines()
              if re.search("warn", line, re.I) and ("reef_core.ui" in line or "reef_core/ui" in line)]
    assert warned == []
    names = set(zipfile.ZipFile(wheelhouse["wheels"]["reef-core"]).namelist())
    expected = {f"reef_core/ui/{p.relative_to(HERE)}" for p in HERE.rglob("*")
                if p.is_file() and p.suffix in (".html", ".css", ".js", ".txt")}
    assert f"reef_core/ui/static/{HTMX}" in expected and "reef_core/ui/templates/scenario.html" in expected
    assert any(n.endswith(".LICENSE.txt") for n in expected)
    assert expected <= names, sorted(expected - names)
