"""Under pytest-xdist (scripts/test: ``--dist loadgroup``) tests that share something run on one
worker: the tests of a module-scoped fixture get their module's ``xdist_group`` (conftest.py),
the wheel tests the group of the wheelhouse they share, and a test that shares nothing none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PRINTER = '''
def pytest_collection_finish(session):
    for item in session.items:
        groups = [m.args[0] for m in item.iter_markers("xdist_group")]
        print("GROUP", item.nodeid, ",".join(groups) or "-", sep="\\t")
'''


def _groups(tmp_path: Path, *paths: str) -> dict[str, str]:
    """``{nodeid: its xdist groups}`` as the suite's collection gives them."""
    (tmp_path / "print_groups.py").write_text(PRINTER)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "print_groups", *paths], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = [line.split("\t") for line in proc.stdout.splitlines() if line.startswith("GROUP\t")]
    return {nodeid: group for _, nodeid, group in found}


CHECKED = ("tests/ui/test_pages.py", "tests/ui/test_ui_wheel.py", "tests/test_wheels.py", "tests/test_scripts.py")
#: a test of each checked module that the default run selects: its absence means this session
#: collected only part of them (a path or ``-k`` given), and the check collects them afresh
EXPECTED = ("tests/ui/test_pages.py::test_chart_points_are_the_apis_numbers",
            "tests/ui/test_ui_wheel.py::test_the_core_wheel_ships_the_dashboard",
            "tests/test_wheels.py::test_every_wheel_builds_without_a_warning[reef-core]",
            "tests/test_scripts.py::test_apt_get_gives_up_after_its_bound")


def _session_groups(session: pytest.Session) -> dict[str, str]:
    """``{nodeid: its xdist groups}`` of the checked modules, as this session collected them.
    pytest-xdist's ``loadgroup`` appends ``@GROUP`` to a grouped test's id: it is taken off."""
    groups = {}
    for item in session.items:
        if not item.nodeid.startswith(tuple(f"{path}::" for path in CHECKED)):
            continue
        marks = [m.args[0] for m in item.iter_markers("xdist_group")]
        nodeid = item.nodeid
        for mark in marks:
            nodeid = nodeid.removesuffix(f"@{mark}")
        groups[nodeid] = ",".join(marks) or "-"
    return groups


def test_tests_that_share_a_fixture_or_the_wheelhouse_are_grouped(tmp_path, request):
    # the whole suite's run has already collected the modules: their marks are read from it
    groups = _session_groups(request.session)
    if not all(nodeid in groups for nodeid in EXPECTED):
        groups = _groups(tmp_path, *CHECKED)
    pages = {n: g for n, g in groups.items() if n.startswith("tests/ui/test_pages.py::")}
    # the tests of learning_run (a module fixture) share one worker; the module's others go anywhere
    assert pages["tests/ui/test_pages.py::test_chart_points_are_the_apis_numbers"] == "module:tests/ui/test_pages.py"
    assert set(pages.values()) == {"module:tests/ui/test_pages.py", "-"}
    wheels = {n: g for n, g in groups.items() if "wheel" in n.split("::")[0]}
    assert len(wheels) > 10 and set(wheels.values()) == {"wheels"}  # one group across both modules
    scripts = {n: g for n, g in groups.items() if n.startswith("tests/test_scripts.py::")}
    assert scripts and set(scripts.values()) == {"-"}  # function fixtures only: spread over the workers


GROUPED = '''
import os, pytest

pytestmark = pytest.mark.xdist_group("shared")


@pytest.mark.parametrize("n", range(8))
def test_in_the_group(n):
    with open(os.environ["WORKERS_LOG"], "a") as log:
        log.write("marked " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")
'''

#: a module whose group only the repository's conftest gives (its tests share a module fixture)
SHARING = '''
import os, pytest


def _log(what):
    with open(os.environ["WORKERS_LOG"], "a") as log:
        log.write(what + " " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.fixture(scope="module")
def expensive():
    _log("setup")
    return 42


@pytest.mark.parametrize("n", range(8))
def test_sharing(expensive, n, request):
    _log("filed-as-" + request.node.nodeid)
'''

#: the repository's conftest.py, loaded from its file: its hook gives the groups
CONFTEST = f'''
import importlib.util

_spec = importlib.util.spec_from_file_location("reef_root_conftest", {str(ROOT / "conftest.py")!r})
_root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_root)
pytest_collection_modifyitems = _root.pytest_collection_modifyitems
'''


def test_a_group_runs_on_one_worker(tmp_path):
    """The marks only count if this pytest and pytest-xdist honour them together: pytest 9.2 with
    pytest-xdist 3.8 collects every mark and then spreads a group over all workers, which set up
    each shared server and fixture once per worker (pyproject.toml pins pytest below 9.2). The
    groups conftest.py gives must reach pytest-xdist too: its hook once ran after xdist's had
    filed the tests, and a module's fixture was set up on each worker."""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_sharing.py").write_text(SHARING)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    log = tmp_path / "workers.log"
    # pytest and pytest-xdist alone (the scheduling is theirs): no other plugin's start-up cost
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "WORKERS_LOG": str(log),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "xdist.plugin", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", "-q", "test_grouped.py", "test_sharing.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line.split() for line in log.read_text().splitlines()]
    workers = {what: [w for kind, w in lines if kind == what] for what in ("marked", "setup")}
    filed = {kind.removeprefix("filed-as-"): w for kind, w in lines if kind.startswith("filed-as-")}
    assert len(workers["marked"]) == 8 and len(set(workers["marked"])) == 1, workers
    assert len(filed) == 8 and len(set(filed.values())) == 1, filed
    assert len(workers["setup"]) == 1, workers  # the module's fixture, once
    # pytest-xdist filed each under the module's group (chance alone can put them on one worker)
    assert all(nodeid.endswith("@module:test_sharing.py") for nodeid in filed), filed
