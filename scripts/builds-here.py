"""Exit 0 when every package directory given can be built in this Python environment as it is
(``pip install --no-build-isolation``): its ``[build-system]`` is the setuptools backend asking
for ``setuptools>=68`` only, and this environment's setuptools is 68 or later. Exit 1 otherwise
(or when it cannot tell), so the caller keeps pip's isolated builds.

Usage: python scripts/builds-here.py DIR [DIR ...]   (scripts/setup.sh)
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

MINIMUM = 68


def builds_here(dirs: list[str]) -> bool:
    try:
        import tomllib  # Python 3.11 or later

        major = int(version("setuptools").split(".")[0])
    except (ImportError, PackageNotFoundError, ValueError):
        return False
    if major < MINIMUM or not dirs:
        return False
    for d in dirs:
        try:
            system = tomllib.loads((Path(d) / "pyproject.toml").read_text())["build-system"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return False
        if system.get("build-backend") != "setuptools.build_meta" or system.get("requires") != [f"setuptools>={MINIMUM}"]:
            return False
    return True


if __name__ == "__main__":
    sys.exit(0 if builds_here(sys.argv[1:]) else 1)
