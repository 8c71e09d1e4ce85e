"""One package shape: a package dropped in the right place is installed, tested and linted.

Every separately installable package is a directory named after its import package holding
pyproject.toml, the package, README.md and tests/; scripts/packages.sh lists them by where
they sit, and setup, pytest and ruff follow the same globs. The tests below build a
repository-shaped temp tree with the real scripts and pyproject.toml and drop packages in it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _listed(root: Path, kind: str = "--all") -> list[str]:
    result = subprocess.run(["bash", str(root / "scripts" / "packages.sh"), kind], capture_output=True, text=True,
                            check=True)
    return result.stdout.split()


def _repo_skeleton(tmp: Path) -> Path:
    """A tree with this repository's scripts/packages.sh, scripts/setup.sh (and the agent-CLI and
    uv steps it runs), pyproject.toml, conftest.py."""
    root = tmp / "repo"
    (root / "scripts").mkdir(parents=True)
    for name in ("packages.sh", "setup.sh", "agent-clis.sh", "uv-install.py"):
        shutil.copy2(ROOT / "scripts" / name, root / "scripts" / name)
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    shutil.copy2(ROOT / "conftest.py", root / "conftest.py")
    return root


def _package(root: Path, where: str, test_body: str = "") -> Path:
    """A package in the shared shape at ``root/where`` (the last part is the import package)."""
    pkg = root / where
    name = pkg.name
    (pkg / name).mkdir(parents=True)
    (pkg / name / "__init__.py").write_text(f"WHO = {name!r}\n")
    (pkg / "pyproject.toml").write_text(f'[project]\nname = "{name.replace("_", "-")}"\nversion = "0.1.0"\n')
    (pkg / "README.md").write_text(f"# {name}\n")
    (pkg / "tests").mkdir()
    (pkg / "tests" / f"test_{name}.py").write_text(test_body or "def test_here():\n    pass\n")
    return pkg


def test_every_package_has_the_shape():
    packages = _listed(ROOT)
    assert "examples/reef_recipe_few_shot" in packages and "plugins/reef_torch" in packages
    for rel in packages:
        pkg = ROOT / rel
        missing = [p for p in ("pyproject.toml", "README.md", f"{pkg.name}/__init__.py", "tests")
                   if not (pkg / p).exists()]
        assert missing == [], f"{rel} lacks {', '.join(missing)}"
        assert list((pkg / "tests").glob("test_*.py")), f"{rel}/tests has no test module"


def test_top_level_recipes_install_as_a_path_entry():
    """A recipe at the top level sits in a folder named like its package, which a process started
    in the repository root sees as an empty namespace package that hides an editable install done
    through an import hook; ``package-dir = {"" = "."}`` makes the install a plain path entry."""
    import tomllib

    for rel in _listed(ROOT, "--installed"):
        if not rel.startswith("reef_recipe_"):
            continue
        config = tomllib.loads((ROOT / rel / "pyproject.toml").read_text())
        assert config.get("tool", {}).get("setuptools", {}).get("package-dir") == {"": "."}, rel


def test_every_pyproject_belongs_to_a_listed_package():
    """A package placed anywhere else would be silently skipped by setup, pytest and ruff."""
    skip = {".venv", ".git", "build", "node_modules"}
    found = {str(p.parent.relative_to(ROOT)) for pattern in ("*/pyproject.toml", "*/*/pyproject.toml")
             for p in ROOT.glob(pattern) if not skip & set(p.relative_to(ROOT).parts)}
    assert found == set(_listed(ROOT))


def test_examples_are_listed_apart_from_what_setup_installs():
    installed, examples = _listed(ROOT, "--installed"), _listed(ROOT, "--examples")
    assert all(p.startswith(("plugins/", "reef_recipe_")) for p in installed)
    assert examples and all(p.startswith("examples/") for p in examples)
    assert sorted(installed + examples) == sorted(_listed(ROOT))


def test_a_new_package_is_listed_by_where_it_sits(tmp_path):
    root = _repo_skeleton(tmp_path)
    _package(root, "plugins/reef_aa")
    _package(root, "reef_recipe_zz")
    _package(root, "examples/reef_recipe_demo")
    _package(root, "recipes/reef_recipe_elsewhere")          # not a place packages live
    (root / "reef_recipe_nopyproject" / "reef_recipe_nopyproject").mkdir(parents=True)  # not a package
    assert _listed(root, "--installed") == ["plugins/reef_aa", "reef_recipe_zz"]
    assert _listed(root, "--examples") == ["examples/reef_recipe_demo"]
    assert _listed(root) == ["plugins/reef_aa", "reef_recipe_zz", "examples/reef_recipe_demo"]


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_setup_installs_every_listed_package_with_torch_pinned_and_reinstalls_for_a_new_one(tmp_path, installer):
    root = _repo_skeleton(tmp_path)
    _package(root, "plugins/reef_aa")
    _package(root, "examples/reef_recipe_demo")
    venv, log = tmp_path / "venv", tmp_path / "pip.log"
    (venv / "bin").mkdir(parents=True)
    record = f'printf "%s\\n" "$*" >> {log}'
    # scripts/uv-install.py --check says whether uv can install (3: pip's configuration says what
    # uv would not be told, and pip installs)
    check = 'if [ "$1 $2" = "scripts/uv-install.py --check" ]; then exit ' + ("0" if installer == "uv" else "3") + "; fi"
    fakes = {"python": f"{check}\n{record}", "pip": record, **({"uv": "exit 0"} if installer == "uv" else {})}
    for name, body in fakes.items():  # a virtualenv whose python and pip record what they were asked
        (venv / "bin" / name).write_text(f"#!/bin/sh\n{body}\n")
        (venv / "bin" / name).chmod(stat.S_IRWXU)
    # the agent CLIs' step is asked to skip (it would install them from npm)
    env = {**os.environ, "REEF_VENV": str(venv), "REEF_SKIP_AGENT_CLIS": "1"}

    def setup() -> list[str]:
        log.unlink(missing_ok=True)
        subprocess.run(["bash", "scripts/setup.sh"], cwd=root, env=env, check=True, capture_output=True, timeout=60)
        return [line for line in log.read_text().splitlines() if "torch==2.13.0" in line] if log.exists() else []

    first = setup()
    assert len(first) == 1
    assert first[0].startswith("scripts/uv-install.py " if installer == "uv" else "install ")
    assert " -e ./plugins/reef_aa" in first[0] and "reef_recipe_demo" not in first[0]
    assert setup() == []  # nothing changed: the stamp holds
    _package(root, "reef_recipe_zz")
    again = setup()
    assert len(again) == 1 and " -e ./reef_recipe_zz" in again[0] and " -e ./plugins/reef_aa" in again[0]
    (root / "reef_recipe_zz" / "pyproject.toml").write_text('[project]\nname = "reef-recipe-zz"\nversion = "0.2.0"\n')
    assert len(setup()) == 1  # a package's pyproject.toml changed: reinstall


def test_pytest_collects_every_package_tests_and_imports_examples_from_source(tmp_path):
    root = _repo_skeleton(tmp_path)
    (root / "tests").mkdir()
    (root / "tests" / "test_root.py").write_text("def test_root():\n    pass\n")
    _package(root, "plugins/reef_aa")
    _package(root, "reef_recipe_zz")
    # The example is not installed: its test module imports it, which only the root conftest allows.
    _package(root, "examples/reef_recipe_demo", test_body=textwrap.dedent("""
        from reef_recipe_demo import WHO

        def test_imports_the_example():
            assert WHO == "reef_recipe_demo"
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                            cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout, result.stdout


def test_ruff_treats_every_package_as_first_party(tmp_path):
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    root = _repo_skeleton(tmp_path)
    _package(root, "plugins/reef_aa")
    _package(root, "reef_recipe_zz")
    _package(root, "examples/reef_recipe_demo")
    sorted_imports = "import os\n\nimport pytest\n\nimport reef_aa\nimport reef_recipe_demo\nimport reef_recipe_zz\n"
    (root / "tests").mkdir()
    (root / "tests" / "test_imports.py").write_text(sorted_imports + "\nprint(os, pytest, reef_aa, reef_recipe_demo, "
                                                    "reef_recipe_zz)\n")
    result = subprocess.run([ruff, "check", "--select", "I", "--no-cache", "tests/test_imports.py"], cwd=root,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    (root / "vendor").mkdir()
    (root / "plugins" / "reef_aa").rename(root / "vendor" / "reef_aa")  # not where packages live: third party
    result = subprocess.run([ruff, "check", "--select", "I", "--no-cache", "tests/test_imports.py"], cwd=root,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "I001" in result.stdout


def test_test_modules_of_the_packages_have_unique_names():
    """The packages' tests/ folders are not Python packages, so pytest imports their modules by
    basename: two `test_advantages.py` in two recipes stop the whole run at collection."""
    seen: dict[str, Path] = {}
    for folder in sorted(ROOT.glob("*/tests")) + sorted(ROOT.glob("*/*/tests")):
        if (folder / "__init__.py").exists() or ".venv" in folder.parts:
            continue
        for module in sorted(folder.glob("test_*.py")):
            first = seen.setdefault(module.name, module)
            assert first == module, f"{module.relative_to(ROOT)} and {first.relative_to(ROOT)} share a name"
