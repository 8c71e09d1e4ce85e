"""Repository-wide test setup: the examples' tests import them from their source trees.

The examples are the one kind of package scripts/setup.sh does not install into .venv (see
scripts/packages.sh), so each is put on ``sys.path`` here, as ``scripts/packages.sh --examples``
lists them: a new example needs no edit anywhere.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def package_dirs(kind: str = "--all", root: Path = ROOT) -> list[Path]:
    """The package directories ``scripts/packages.sh`` lists under ``root``."""
    out = subprocess.run(["bash", str(root / "scripts" / "packages.sh"), kind], capture_output=True, text=True,
                         check=True).stdout
    return [root / line for line in out.splitlines() if line]


for example in package_dirs("--examples"):
    if str(example) not in sys.path:
        sys.path.insert(0, str(example))
