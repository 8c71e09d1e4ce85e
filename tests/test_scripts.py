"""The setup and test scripts: apt-get waits (bounded) for a held package-manager lock,
scripts/test stops the PostgreSQL it started (on a free port) while keeping a given
REEF_TEST_POSTGRES_URL as it is, and runs the tests on pytest-xdist workers."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


@pytest.fixture(autouse=True)
def _no_worker_count_of_the_caller(monkeypatch):
    """scripts/test's worker count is what each test says: a suite run itself with
    REEF_TEST_WORKERS set (``REEF_TEST_WORKERS=3 scripts/test``) must not hand it on."""
    monkeypatch.delenv("REEF_TEST_WORKERS", raising=False)


LOCKED = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)"


def _stub(path: Path, body: str) -> Path:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return path


def _apt(tmp_path: Path, locked_calls: int, *, fail_with: str = LOCKED, wait: str = "30"):
    """Run scripts/apt-get.sh with an apt-get that fails ``locked_calls`` times, then succeeds
    (trying again every second while the lock is held)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _stub(bin_dir / "apt-get", f"""echo "$*" >> {calls}
n=$(wc -l < {calls})
if [ "$n" -le {locked_calls} ]; then echo "{fail_with}" >&2; exit 100; fi
echo installed
""")
    _stub(bin_dir / "sudo", 'exec "$@"\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REEF_APT_LOCK_WAIT": wait,
           "REEF_APT_LOCK_POLL": "1"}
    result = subprocess.run([str(SCRIPTS / "apt-get.sh"), "install", "-y", "git-lfs"], env=env,
                            capture_output=True, text=True, timeout=120)
    return result, calls.read_text().splitlines() if calls.exists() else []


def test_apt_get_waits_for_a_held_lock_then_goes_on(tmp_path):
    result, calls = _apt(tmp_path, locked_calls=2)
    assert result.returncode == 0, result.stderr
    assert "installed" in result.stdout and len(calls) == 3
    assert "another process holds the package manager's lock; waiting" in result.stderr
    assert result.stderr.count("waiting for it") == 1  # said once, not per try
    assert LOCKED in result.stderr  # apt's own line says which process holds it
    assert all(c.startswith("-o DPkg::Lock::Timeout=") and c.endswith("install -y git-lfs") for c in calls)


def test_apt_get_gives_up_after_its_bound(tmp_path):
    result, calls = _apt(tmp_path, locked_calls=1000, wait="2")
    assert result.returncode == 100
    # tried until the bound (once only, when the first try alone outlasted it on a busy machine)
    assert "still holds the package manager's lock after 2s" in result.stderr and len(calls) >= 1
    assert result.stderr.count("still holds") == 1


def test_apt_get_fails_at_once_for_other_errors(tmp_path):
    result, calls = _apt(tmp_path, locked_calls=5, fail_with="E: Unable to locate package git-lfs")
    assert result.returncode == 100 and len(calls) == 1
    assert "waiting" not in result.stderr and "Unable to locate package" in result.stderr


def _fake_checkout(tmp_path: Path) -> Path:
    """scripts/test in a tree whose setup, PostgreSQL helper and interpreter only say how they
    were called."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy2(SCRIPTS / "test", tree / "scripts" / "test")
    _stub(tree / "scripts" / "setup.sh", "exit 0\n")
    _stub(tree / "scripts" / "postgres.sh",
          'echo "postgres.sh $1" >> "$LOG"; shift; REEF_TEST_POSTGRES_URL=postgresql://own exec "$@"\n')
    (tree / ".venv" / "bin").mkdir(parents=True)
    _stub(tree / ".venv" / "bin" / "python", 'echo "python $* url=$REEF_TEST_POSTGRES_URL" >> "$LOG"\n')
    return tree


#: the pytest-xdist options scripts/test gives by default: half as many workers again as cores
XDIST = f"-n {len(os.sched_getaffinity(0)) * 3 // 2} --dist loadgroup"


def test_scripts_test_keeps_a_given_postgres_url(tmp_path):
    tree, log = _fake_checkout(tmp_path), tmp_path / "log"
    env = {**os.environ, "LOG": str(log), "REEF_TEST_POSTGRES_URL": "postgresql://given"}
    result = subprocess.run([str(tree / "scripts" / "test"), "--fast", "tests/x.py"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == [f"python -m pytest {XDIST} -m not slow tests/x.py url=postgresql://given"]


def test_scripts_test_runs_its_own_postgres_without_one(tmp_path):
    tree, log = _fake_checkout(tmp_path), tmp_path / "log"
    env = {k: v for k, v in os.environ.items() if k != "REEF_TEST_POSTGRES_URL"}
    env["LOG"] = str(log)
    result = subprocess.run([str(tree / "scripts" / "test"), "tests/x.py"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == ["postgres.sh --run",
                                            f"python -m pytest {XDIST} -m not slow tests/x.py url=postgresql://own"]


@pytest.mark.parametrize("argv, pytest_args", [
    (["--all"], ""),
    (["tests/x.py", "--all", "-x"], " tests/x.py -x"),
    (["-m", "postgres"], " -m not slow -m postgres"),  # pytest takes the last -m
])
def test_scripts_test_runs_the_slow_tests_only_with_all(tmp_path, argv, pytest_args):
    tree, log = _fake_checkout(tmp_path), tmp_path / "log"
    env = {**os.environ, "LOG": str(log), "REEF_TEST_POSTGRES_URL": "postgresql://given"}
    result = subprocess.run([str(tree / "scripts" / "test"), *argv], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == [f"python -m pytest {XDIST}{pytest_args} url=postgresql://given"]


@pytest.mark.parametrize("workers, argv, pytest_args", [
    (None, ["-n", "0", "tests/x.py"], f"{XDIST} -m not slow -n 0 tests/x.py"),  # pytest takes the last -n
    ("5", ["tests/x.py"], "-n 5 --dist loadgroup -m not slow tests/x.py"),
])
def test_scripts_test_runs_on_xdist_workers_unless_told_otherwise(tmp_path, workers, argv, pytest_args):
    tree, log = _fake_checkout(tmp_path), tmp_path / "log"
    env = {**os.environ, "LOG": str(log), "REEF_TEST_POSTGRES_URL": "postgresql://given"}
    env.pop("REEF_TEST_WORKERS", None)
    if workers:
        env["REEF_TEST_WORKERS"] = workers
    result = subprocess.run([str(tree / "scripts" / "test"), *argv], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == [f"python -m pytest {pytest_args} url=postgresql://given"]


@pytest.mark.parametrize("given, workers, threads", [
    ({}, "1", str(len(os.sched_getaffinity(0)))),      # one worker: all the cores
    ({}, "64", "1"),                                    # more workers than cores: one thread each
    ({"OMP_NUM_THREADS": "3"}, "1", "3"),               # a value of the caller's own is kept
])
def test_scripts_test_gives_each_worker_its_share_of_the_cores_for_torch(tmp_path, given, workers, threads):
    """torch's threads default to one per core in every worker, and a busy machine then trains
    the tiny models many times slower; scripts/test exports OMP_NUM_THREADS and MKL_NUM_THREADS
    as the cores over the workers (the machine's cores even when the caller set OMP_NUM_THREADS,
    which GNU nproc would count instead)."""
    tree, log = _fake_checkout(tmp_path), tmp_path / "log"
    _stub(tree / ".venv" / "bin" / "python", 'echo "$OMP_NUM_THREADS $MKL_NUM_THREADS $*" >> "$LOG"\n')
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env.update(LOG=str(log), REEF_TEST_POSTGRES_URL="postgresql://given", REEF_TEST_WORKERS=workers, **given)
    result = subprocess.run([str(tree / "scripts" / "test"), "tests/x.py"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == [f"{threads} {threads} -m pytest -n {workers} --dist loadgroup -m not slow "
                                            "tests/x.py"]


def test_scripts_test_lets_python_cache_bytecode(tmp_path):
    """With PYTHONDONTWRITEBYTECODE from the caller's environment, every process the suite
    starts would compile Reef's sources again: scripts/test lets bytecode be cached."""
    tree, log = _fake_checkout(tmp_path), tmp_path / "log"
    _stub(tree / ".venv" / "bin" / "python", 'echo "dont-write=${PYTHONDONTWRITEBYTECODE-unset}" >> "$LOG"\n')
    env = {**os.environ, "LOG": str(log), "REEF_TEST_POSTGRES_URL": "postgresql://given", "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run([str(tree / "scripts" / "test"), "tests/x.py"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == ["dont-write=unset"]


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.skipif(not glob.glob("/usr/lib/postgresql/*/bin/initdb"), reason="PostgreSQL is not installed")
def test_postgres_run_stops_and_removes_the_server_it_started(tmp_path):
    out = tmp_path / "seen"
    code = ('import os, sys, psycopg\n'
            'url = os.environ["REEF_TEST_POSTGRES_URL"]\n'
            'with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as c:\n'
            '    assert c.execute("select 1").fetchone() == (1,)\n'
            f'open({str(out)!r}, "w").write(url + "\\n" + os.environ["REEF_TEST_PG_DIR"])\n'
            'sys.exit(3)\n')
    python = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else "python3"
    result = subprocess.run([str(SCRIPTS / "postgres.sh"), "--run", python, "-c", code], capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 3, result.stderr  # the command's status
    url, data_dir = out.read_text().splitlines()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert not _accepts(port)  # stopped
    assert not Path(data_dir).exists()  # and removed


def _package(root: Path, name: str, system: str) -> str:
    (root / name).mkdir()
    (root / name / "pyproject.toml").write_text(f"[project]\nname = '{name}'\n\n[build-system]\n{system}")
    return str(root / name)


SETUPTOOLS = 'requires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'


@pytest.mark.parametrize("system, here", [
    (SETUPTOOLS, True),
    ('requires = ["setuptools>=68", "wheel"]\nbuild-backend = "setuptools.build_meta"\n', False),  # wheel: not here
    ('requires = ["setuptools>=90"]\nbuild-backend = "setuptools.build_meta"\n', False),
    ('requires = ["hatchling"]\nbuild-backend = "hatchling.build"\n', False),
    ("", False),  # no build system named: pip's default, left to pip
])
def test_setup_builds_in_its_venv_only_what_that_venv_can_build(tmp_path, system, here):
    """scripts/setup.sh passes --no-build-isolation only when every package asks for no more
    than the venv's setuptools (scripts/builds-here.py); anything else keeps pip's isolation."""
    import sys

    dirs = [_package(tmp_path, "ok", SETUPTOOLS), _package(tmp_path, "other", system)]
    run = subprocess.run([sys.executable, str(SCRIPTS / "builds-here.py"), *dirs], capture_output=True, text=True)
    assert run.returncode == (0 if here else 1), run.stderr
    # Reef's own packages, as setup.sh lists them: this venv builds them all
    packages = subprocess.run([str(SCRIPTS / "packages.sh"), "--installed"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.split()
    assert subprocess.run([sys.executable, str(SCRIPTS / "builds-here.py"), ".", *packages], cwd=ROOT).returncode == 0
    assert "builds-here.py" in (SCRIPTS / "setup.sh").read_text()
