"""Every config group file says what the class it names does when the option is left out.

A group file's values are what ``reef serve recipe=NAME`` runs with, so a value that differs
from the class's own default silently changes behaviour between ``recipe=sao`` and a config
file that only names the recipe. It happened: the three weight recipes' files kept
``max_staleness: 0`` (once a count of releases) after it became lineage steps with a default of
64, so under a real gate their lineage was reset every time it got ahead of serving.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from reef_core.plugins import load_plugins

#: a scalar default the group file may state differently, with the reason
DIFFERENT_ON_PURPOSE: dict[tuple[str, str, str], str] = {}


def _group_files() -> list[tuple[str, Path]]:
    plugins = load_plugins()
    roots = [Path(__file__).resolve().parents[1] / "reef_core" / "conf"] + [d for _, d in plugins.config_dirs]
    return [(y.parent.name, y) for root in roots for y in sorted(root.glob("*/*.yaml"))]


def _scalar_mismatches(kind: str, path: Path) -> list[str]:
    conf = yaml.safe_load(path.read_text()) or {}
    plugins = load_plugins()
    name = conf.get("name")
    if kind not in plugins.registry or name not in plugins.registry[kind]:
        return []  # a group that selects by other means (recipe_default, a store URL)
    params = inspect.signature(plugins.get(kind, name)).parameters
    out = []
    for key, value in conf.items():
        par = params.get(key)
        if key == "name" or par is None:
            continue
        default = par.default
        if isinstance(default, (bool, int, float, str)) and default != value \
                and (kind, name, key) not in DIFFERENT_ON_PURPOSE:
            out.append(f"{kind}/{path.name}: {key}: {value!r} in the file, {default!r} in {plugins.get(kind, name).__name__}")
    return out


def test_group_files_are_found_for_the_recipes_that_have_them():
    names = {p.stem for kind, p in _group_files() if kind == "recipe"}
    assert {"sao", "openclaw", "tttd", "feedback_rules"} <= names


@pytest.mark.parametrize("kind,path", _group_files(), ids=lambda v: v.name if isinstance(v, Path) else v)
def test_a_group_file_states_its_class_defaults(kind, path):
    assert _scalar_mismatches(kind, path) == []


def test_the_check_sees_a_file_that_differs(tmp_path):
    sao = next(p for kind, p in _group_files() if p.name == "sao.yaml")
    changed = tmp_path / "recipe" / "sao.yaml"
    changed.parent.mkdir()
    changed.write_text(sao.read_text().replace("max_staleness: 64", "max_staleness: 0"))
    assert _scalar_mismatches("recipe", changed) == ["recipe/sao.yaml: max_staleness: 0 in the file, 64 in SAORecipe"]
