"""scripts/uv-install.py: uv is told what pip's configuration tells pip, or not used at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.wheelhouse import ask_uv_options, setup_uv

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "uv-install.py"
NEEDS_UV = pytest.mark.skipif(setup_uv() is None,
                              reason="this environment was installed with pip (no uv beside its Python)")


def _pip_env(tmp_path: Path, config: str, **extra: str) -> dict[str, str]:
    """This environment with pip's configuration replaced by ``config`` (and ``extra`` PIP_* variables)."""
    path = tmp_path / "pip.conf"
    path.write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": str(path), **extra}


CONFIG = """[global]
index-url = https://mirror.example/simple
extra-index-url = file:///srv/a/simple
    file:///srv/b/simple
find-links = /srv/wheels
trusted-host = mirror.example
cert = /srv/ca.pem
constraint = /srv/constraints.txt
timeout = 60
"""


def _options(env: dict[str, str]) -> dict:
    """What ``scripts/uv-install.py --options`` says under ``env``."""
    asked = ask_uv_options(env)
    assert asked.returncode == 0, asked.stderr
    return json.loads(asked.stdout)


@NEEDS_UV
def test_pip_configuration_becomes_uv_options(tmp_path):
    options = _options(_pip_env(tmp_path, CONFIG, PIP_FIND_LINKS="/srv/other-wheels"))
    args, env = options["args"], options["env"]
    assert args == ["--index-strategy", "unsafe-best-match",
                    "--index-url", "https://mirror.example/simple",
                    "--extra-index-url", "file:///srv/a/simple", "--extra-index-url", "file:///srv/b/simple",
                    # a PIP_* variable wins over the file, as it does for pip
                    "--find-links", "/srv/other-wheels",
                    "--constraint", "/srv/constraints.txt",
                    "--allow-insecure-host", "mirror.example"]
    assert env == {"SSL_CERT_FILE": "/srv/ca.pem"}  # the timeout changes nothing installed


@NEEDS_UV
@pytest.mark.parametrize("config, extra, named", [
    ("[global]\npre = true\n", {}, "pre"),
    ("[global]\n", {"PIP_ONLY_BINARY": ":all:"}, "format_control"),
    ("[install]\nno-deps = true\n", {}, "ignore_dependencies"),
])
def test_anything_else_pip_is_told_leaves_the_install_to_pip(tmp_path, config, extra, named):
    checked = subprocess.run([sys.executable, str(SCRIPT), "--check"], env=_pip_env(tmp_path, config, **extra),
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 3
    assert checked.stderr.count("\n") == 1 and named in checked.stderr and "installing with pip" in checked.stderr


@NEEDS_UV
def test_uv_takes_the_options_it_is_handed(tmp_path):
    """uv itself accepts every option handed to it: a dry run of what is already installed
    (offline: nothing is fetched for requirements that are satisfied)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    config = (f"[global]\nindex-url = {wheels.as_uri()}\nextra-index-url = {wheels.as_uri()}\n"
              f"find-links = {wheels}\ntrusted-host = localhost\n")
    done = subprocess.run([sys.executable, str(SCRIPT), "-q", "--dry-run", "--offline", "pip"],
                          env=_pip_env(tmp_path, config), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
