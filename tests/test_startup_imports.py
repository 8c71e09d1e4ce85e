"""Every ``reef`` command starts without importing what it does not use.

Each command loads every installed plugin, so discovery reads entry points, config directories
and registrations without importing a recipe's training code: the weight recipes register their
classes by reference (``"module:attr"``), imported when a configuration selects them.
``import reef_core`` — what each plugin's entry point does first — leaves the record store and
the learning loop alone. Each case runs in a fresh interpreter and reads its ``sys.modules``;
how long the commands take is bench/startup.py's business, never asserted here.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: what a command that does not train, serve a model or read the store must not import
HEAVY = ("torch", "transformers", "sqlalchemy", "reef_core.store")
#: plugins whose training code imports torch: discovery must not
WEIGHT_RECIPES = ("tttd", "sao", "openclaw")


def modules_after(tmp_path: Path, code: str, *argv: str) -> tuple[set[str], subprocess.CompletedProcess]:
    """The modules a fresh interpreter holds when ``code`` ends, run with ``sys.argv`` =
    ``['reef', *argv]`` in ``tmp_path`` with every installed plugin allowed."""
    out = tmp_path / "modules.json"
    prelude = ("import atexit, json, sys\n"
               f"atexit.register(lambda: open({str(out)!r}, 'w').write(json.dumps(sorted(sys.modules))))\n"
               f"sys.argv = ['reef', *{list(argv)!r}]\n")
    env = {k: v for k, v in os.environ.items() if k != "REEF_PLUGINS"}
    done = subprocess.run([sys.executable, "-c", prelude + code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert out.exists(), done.stderr
    return set(json.loads(out.read_text())), done


def heavy_in(modules: set[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    return sorted(h for h in heavy if h in modules)


def test_the_weight_recipes_are_installed():
    """The cases below mean something only with the recipes that import torch installed."""
    assert set(WEIGHT_RECIPES) <= {ep.name for ep in importlib.metadata.entry_points(group="reef")}


def test_import_reef_core_imports_neither_the_store_nor_a_model(tmp_path):
    modules, _ = modules_after(tmp_path, "import reef_core")
    assert heavy_in(modules, (*HEAVY, "omegaconf", "hydra", "reef_core.grow.loop", "reef_core.commit.chain")) == []


def test_discovering_every_plugin_imports_no_training_code(tmp_path):
    code = ("from reef_core.plugins import load_plugins\n"
            "plugins = load_plugins()\n"
            "print(json.dumps(plugins.names('recipe')))\n")
    modules, done = modules_after(tmp_path, code)
    assert done.returncode == 0, done.stderr
    assert set(WEIGHT_RECIPES) <= set(json.loads(done.stdout))  # registered, by reference
    assert heavy_in(modules) == []


@pytest.mark.parametrize(("argv", "heavy"), [
    pytest.param(("--help",), HEAVY, id="reef --help"),
    pytest.param(("config",), HEAVY, id="reef config"),
    pytest.param(("plugins",), ("torch", "transformers"), id="reef plugins"),
    pytest.param(("tttd", "--help"), ("torch", "transformers"), id="reef tttd --help"),
])
def test_a_command_imports_only_what_it_uses(tmp_path, argv, heavy):
    modules, done = modules_after(tmp_path, "from reef_core.cli import main\nmain()\n", *argv)
    assert done.returncode == 0, done.stderr
    assert heavy_in(modules, heavy) == []


@pytest.mark.parametrize("recipe", WEIGHT_RECIPES)
def test_selecting_a_weight_recipe_imports_it_and_not_its_training_code(tmp_path, recipe):
    """The reference resolves when the configuration names the recipe (its options are checked
    against its constructor), so laziness costs nothing in correctness; the recipe's module
    imports its training code (torch) and the lineage's store where they run, so checking a
    configuration that names it (``reef config``, a command reading what a server serves)
    imports neither."""
    modules, done = modules_after(tmp_path, "from reef_core.cli import main\nmain()\n", "config",
                                  f"recipe={recipe}", "evaluator=always")
    assert done.returncode == 0, done.stderr
    assert f"reef_recipe_{recipe}.recipe" in modules and f"name: {recipe}" in done.stdout
    assert heavy_in(modules, (*HEAVY, "peft")) == []


def test_reef_releases_answered_by_a_running_server_imports_no_store(tmp_path):
    """With a server to ask (``REEF_URL``), ``reef releases`` reads the chain over HTTP: the store
    (SQLAlchemy) is for when no server answers."""
    from reef_core.testing import FakeUpstream, ReefServer

    with FakeUpstream("openai") as up, ReefServer(tmp_path / "served", upstream=up) as server:
        code = (f"import os\nos.environ['REEF_URL'] = {server.url!r}\n"
                "from reef_core.cli import main\nmain()\n")
        modules, done = modules_after(tmp_path, code, "releases", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [] and "sent to the running server" in done.stderr
    assert heavy_in(modules) == []
