"""Plugins use only the public surface: ``reef_core``'s ``__all__``, ``reef_core.testing`` and
``reef_core.kit``. Every public name imports and says what it is."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ("reef_core", "reef_core.testing", "reef_core.kit")
SKIP_PARTS = {"build", ".venv", "__pycache__", ".hypothesis"}


def _public_names(module: str) -> set[str]:
    return set(importlib.import_module(module).__all__)


def plugin_sources() -> list[Path]:
    """Every .py of the plugin packages, recipe packages and examples (not build output)."""
    roots = [*ROOT.glob("plugins/*/"), *ROOT.glob("reef_recipe_*/"), *ROOT.glob("examples/*/")]
    files = {f for r in roots if r.is_dir() for f in r.rglob("*.py")} | set(ROOT.glob("examples/*.py"))
    return sorted(f for f in files
                  if not SKIP_PARTS.intersection(f.relative_to(ROOT).parts)
                  and not any(p.endswith(".egg-info") for p in f.parts))


def private_imports(path: Path) -> list[str]:
    """``file:line: import`` for each import of ``reef_core`` outside the public surface."""
    allowed = {m: _public_names(m) for m in PUBLIC}
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names
                   if (a.name == "reef_core" or a.name.startswith("reef_core.")) and a.name not in PUBLIC]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == "reef_core" or node.module.startswith("reef_core.")):
            names = allowed.get(node.module, set())
            bad = [f"{node.module}.{a.name}" for a in node.names if a.name not in names]
        else:
            continue
        found += [f"{where}:{node.lineno}: {ast.get_source_segment(path.read_text(), node) or name}" for name in bad]
    return found


def test_the_scan_covers_every_plugin_package_and_the_example():
    sources = {f.relative_to(ROOT).parts[:2] for f in plugin_sources()}
    for package in ("plugins/reef_torch", "plugins/reef_sglang", "plugins/reef_train", "examples/reef_recipe_few_shot"):
        assert tuple(package.split("/")) in sources, package


def test_plugins_import_only_the_public_surface():
    offences = [line for f in plugin_sources() for line in private_imports(f)]
    assert offences == [], "imports from reef_core outside its public surface:\n" + "\n".join(offences)


def test_a_private_import_is_named_with_its_file_and_line(tmp_path):
    source = tmp_path / "plugin.py"
    source.write_text("from reef_core import Recipe, hookimpl\nimport reef_core.kit\n"
                      "from reef_core.plugins import get_plugins\n\n"
                      "def f():\n    import reef_core.store.models\n    from reef_core import Reef\n"
                      "    from reef_core.kit import AdapterTable\n")
    assert private_imports(source) == [
        f"{source}:3: from reef_core.plugins import get_plugins",
        f"{source}:6: import reef_core.store.models",
        f"{source}:7: from reef_core import Reef",
    ]


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_name_imports_and_has_a_docstring(module):
    mod = importlib.import_module(module)
    assert mod.__doc__, module
    undocumented = []
    for name in mod.__all__:
        obj = getattr(mod, name)  # AttributeError: __all__ names something that is not there
        if inspect.isclass(obj):
            doc = obj.__dict__.get("__doc__") or ""
            if dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
                doc = ""  # the signature dataclasses write in when the class has no docstring
        elif inspect.isfunction(obj) or inspect.ismodule(obj):
            doc = obj.__doc__ or ""
        else:
            continue  # values (__version__) and markers (hookimpl)
        if not doc.strip():
            undocumented.append(name)
    assert undocumented == [], f"{module}: public names without a docstring: {undocumented}"


def test_the_kit_imports_without_torch_or_the_server():
    import subprocess
    import sys

    code = ("import sys, reef_core.kit as kit; [getattr(kit, n) for n in kit.__all__]; "
            "print(sorted(m for m in ('torch', 'fastapi', 'reef_core.serve.app', 'reef_core.kernel') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
