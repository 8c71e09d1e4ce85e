"""Plugin loading: entry points, REEF_PLUGINS, validation of what plugins register."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reef_core import hookspecs
from reef_core.errors import PluginError
from reef_core.plugins import builtin_modules, load_plugins

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "reef_recipe_few_shot"


def test_every_hook_is_documented():
    specs = [
        (name, fn) for name, fn in vars(hookspecs).items()
        if callable(fn) and hasattr(fn, "reef_spec")
    ]
    assert len(specs) >= 12
    undocumented = [name for name, fn in specs if not (inspect.getdoc(fn) or "").strip()]
    assert undocumented == []


def test_every_hook_implementation_matches_a_spec():
    # load_plugins runs pm.check_pending(): an impl whose name matches no hook fails there
    plugins = load_plugins(env={"REEF_PLUGINS": ""})
    assert plugins.pm.get_plugins()


def test_builtins_register_like_third_party_plugins():
    plugins = load_plugins(env={"REEF_PLUGINS": ""})
    names = {p["name"] for p in plugins.describe()}
    assert set(builtin_modules()) <= names
    assert "basic" in plugins.names("recipe")
    reg = plugins.registry["recipe"]["basic"]
    assert reg.plugin == "reef_core.builtins.basic"


def _fake_dist(site: Path, name: str, module_source: str) -> None:
    """Make ``site`` hold an installed distribution with a ``reef`` entry point, as pip would."""
    (site / f"{name}.py").write_text(textwrap.dedent(module_source))
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[reef]\n{name} = {name}\n")
    (info / "RECORD").write_text("")


def _reef(site: Path | None, *args: str, env_extra: dict[str, str] | None = None, cwd: Path | None = None):
    env = {k: v for k, v in os.environ.items() if k != "REEF_PLUGINS"}
    if site is not None:  # before the caller's path (this checkout's packages), not in place of it
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "reef_core", *args], env=env, capture_output=True,
                          text=True, timeout=120, cwd=cwd)


BROKEN = {
    "raises_on_import": "raise RuntimeError('boom at import')\n",
    "duplicate_name": """
        from reef_core import hookimpl

        class Other:
            update_target = "none"; filters = (); batch_size = 0; default_evaluator = "always"
            def propose(self, batch, current, ctx):
                return None

        @hookimpl
        def register_recipes(register):
            register("basic", Other)
        """,
    "missing_method": """
        from reef_core import hookimpl

        class NoPropose:
            update_target = "none"; filters = (); batch_size = 0; default_evaluator = "always"

        @hookimpl
        def register_recipes(register):
            register("nopropose", NoPropose)
        """,
    "unknown_hook": """
        from reef_core import hookimpl

        @hookimpl
        def register_reciepes(register):
            pass
        """,
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_plugin_fails_with_one_line_naming_it(tmp_path, name):
    _fake_dist(tmp_path, name, BROKEN[name])
    result = _reef(tmp_path, "plugins")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert name in lines[0] and lines[0].startswith("Error: ")
    assert "Traceback" not in result.stderr


def test_broken_plugin_is_not_loaded_when_not_allowed(tmp_path):
    _fake_dist(tmp_path, "raises_on_import", BROKEN["raises_on_import"])
    result = _reef(tmp_path, "plugins", "--json", env_extra={"REEF_PLUGINS": ""})
    assert result.returncode == 0, result.stderr
    assert "raises_on_import" not in {p["name"] for p in json.loads(result.stdout)}


def test_unknown_name_in_reef_plugins_is_an_error(tmp_path):
    result = _reef(None, "plugins", env_extra={"REEF_PLUGINS": "no_such_plugin"})
    assert result.returncode == 2
    assert "no_such_plugin" in result.stderr


def test_in_process_errors_are_plugin_errors(tmp_path, monkeypatch):
    _fake_dist(tmp_path, "missing_method", BROKEN["missing_method"])
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="missing_method.*propose"):
        load_plugins(env={})


@pytest.fixture(scope="module")
def example_site(tmp_path_factory) -> Path:
    """The example third-party plugin, installed with pip into its own directory."""
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(site), str(EXAMPLE)],
        check=True, capture_output=True, timeout=300,
    )
    return site


def test_example_plugin_is_listed_and_selectable(example_site, tmp_path):
    listed = _reef(example_site, "plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    info = {p["name"]: p for p in json.loads(listed.stdout)}
    assert info["few_shot"]["registered"] == {"recipe": ["few_shot"]}
    assert info["few_shot"]["version"] == "0.1.0"

    cfg = _reef(example_site, "config", "recipe=few_shot", "recipe.max_examples=2", cwd=tmp_path)
    assert cfg.returncode == 0, cfg.stderr
    assert "name: few_shot" in cfg.stdout and "max_examples: 2" in cfg.stdout

    bad = _reef(example_site, "config", "recipe=few_shot", "+recipe.bogus=1", cwd=tmp_path)
    assert bad.returncode == 2 and "recipe.bogus" in bad.stderr


def test_example_plugin_not_loaded_with_empty_reef_plugins(example_site, tmp_path):
    listed = _reef(example_site, "plugins", "--json", env_extra={"REEF_PLUGINS": ""})
    assert "few_shot" not in {p["name"] for p in json.loads(listed.stdout)}
    cfg = _reef(example_site, "config", "recipe=few_shot", env_extra={"REEF_PLUGINS": ""}, cwd=tmp_path)
    assert cfg.returncode == 2
    assert "few_shot" in cfg.stderr and len(cfg.stderr.strip().splitlines()) == 1


def test_hookspec_module_is_small_and_flat():
    tree = ast.parse(Path(hookspecs.__file__).read_text())
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert all(len(f.body) == 1 for f in funcs)  # a docstring and nothing else


# ------------------------------------------------------------------ registered by reference

#: a recipe registered as "module:attr"; its module says on stderr when it is imported
LAZY_RECIPE = """
    from reef_core import hookimpl

    @hookimpl
    def register_recipes(register):
        register("heavy", "lazy_recipe_impl:HeavyRecipe")
        register("gone", "lazy_recipe_missing:Nothing")
        register("hollow", "lazy_recipe_impl:Hollow")
    """
LAZY_RECIPE_IMPL = """
    import sys

    print("lazy_recipe_impl imported", file=sys.stderr)

    class HeavyRecipe:
        update_target = "none"; filters = (); batch_size = 0; default_evaluator = "always"

        def __init__(self, depth: int = 1):
            self.depth = depth

        def propose(self, batch, current, ctx):
            return None

    class Hollow:
        update_target = "none"; filters = (); batch_size = 0; default_evaluator = "always"
    """


@pytest.fixture()
def lazy_site(tmp_path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    _fake_dist(site, "lazy_recipe", LAZY_RECIPE)
    (site / "lazy_recipe_impl.py").write_text(textwrap.dedent(LAZY_RECIPE_IMPL))
    return site


def test_a_reference_is_listed_without_importing_it(lazy_site, tmp_path):
    listed = _reef(lazy_site, "plugins", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    info = {p["name"]: p for p in json.loads(listed.stdout)}
    assert info["lazy_recipe"]["registered"] == {"recipe": ["gone", "heavy", "hollow"]}
    assert "lazy_recipe_impl imported" not in listed.stderr


def test_a_reference_is_imported_and_checked_when_selected(lazy_site, tmp_path):
    cfg = _reef(lazy_site, "config", "recipe.name=heavy", "+recipe.depth=3", cwd=tmp_path)
    assert cfg.returncode == 0, cfg.stderr
    assert "lazy_recipe_impl imported" in cfg.stderr and "depth: 3" in cfg.stdout
    bad = _reef(lazy_site, "config", "recipe.name=heavy", "+recipe.bogus=1", cwd=tmp_path)
    assert bad.returncode == 2 and "recipe.bogus" in bad.stderr  # its constructor is the schema, as for a class


@pytest.mark.parametrize(("recipe", "says"), [
    ("gone", "(lazy_recipe_missing:Nothing) failed to load: ModuleNotFoundError"),
    ("hollow", "without required member(s): propose"),
])
def test_a_broken_reference_fails_with_one_line_naming_its_plugin_when_selected(lazy_site, tmp_path, recipe, says):
    result = _reef(lazy_site, "config", f"recipe.name={recipe}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: plugin 'lazy_recipe'") and recipe in last and says in last
    assert "Traceback" not in result.stderr


def test_a_reference_must_name_module_and_attribute(tmp_path, monkeypatch):
    _fake_dist(tmp_path, "bad_reference", """
        from reef_core import hookimpl

        @hookimpl
        def register_recipes(register):
            register("nameless", "just_a_module")
        """)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="bad_reference.*'just_a_module'.*module:attr"):
        load_plugins(env={"REEF_PLUGINS": "bad_reference"})


# ------------------------------------------------------------------ commands (register_commands)

COMMANDS = {
    "hello_command": """
        import click
        from reef_core import hookimpl

        @hookimpl
        def register_commands(cli):
            @cli.command("hello")
            @click.argument("who")
            def hello(who):
                \"\"\"Say hello to WHO.\"\"\"
                click.echo(f"hello {who}")
        """,
    "takes_serve": """
        import click
        from reef_core import hookimpl

        @hookimpl
        def register_commands(cli):
            @cli.command("serve")
            def serve():
                \"\"\"Not Reef's serve.\"\"\"
        """,
    "command_hook_raises": """
        from reef_core import hookimpl

        @hookimpl
        def register_commands(cli):
            raise RuntimeError("no commands today")
        """,
}


def _command_site(tmp_path: Path, *names: str) -> Path:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    for name in names:
        _fake_dist(site, name, COMMANDS[name])
    return site


def test_a_plugin_command_is_listed_run_and_described(tmp_path):
    site = _command_site(tmp_path, "hello_command")
    helped = _reef(site, "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "hello" in helped.stdout and "Say hello to WHO." in helped.stdout
    ran = _reef(site, "hello", "world", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "hello world\n"
    listed = _reef(site, "plugins", "--json", cwd=tmp_path)
    info = {p["name"]: p for p in json.loads(listed.stdout)}
    assert info["hello_command"]["registered"] == {"command": ["hello"]}
    assert "register_commands" in info["hello_command"]["hooks"]


def test_a_plugin_command_is_not_there_when_the_plugin_is_not_allowed(tmp_path):
    site = _command_site(tmp_path, "hello_command")
    ran = _reef(site, "hello", "world", env_extra={"REEF_PLUGINS": ""}, cwd=tmp_path)
    assert ran.returncode == 2 and "No such command 'hello'" in ran.stderr


def test_a_plugin_cannot_take_a_command_reef_has(tmp_path):
    site = _command_site(tmp_path, "takes_serve", "hello_command")
    helped = _reef(site, "--help", cwd=tmp_path)  # help still lists Reef's own, and says why not the rest
    assert helped.returncode == 0 and "Run the server." in helped.stdout
    assert "takes_serve" in helped.stderr and "'serve'" in helped.stderr and "reef already has" in helped.stderr
    other = _reef(site, "hello", "x", cwd=tmp_path)
    assert other.returncode == 2
    assert other.stderr.strip().splitlines() == [
        "Error: plugin 'takes_serve' adds the command 'serve', which reef already has"]
    own = _reef(site, "serve", "--help", cwd=tmp_path)  # Reef's own command never asks the plugins
    assert own.returncode == 0 and "Run the server." in own.stdout


def test_a_failing_command_hook_is_one_line_and_spares_reefs_own_commands(tmp_path):
    site = _command_site(tmp_path, "command_hook_raises")
    result = _reef(site, "nosuch", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "Error: plugin 'command_hook_raises' failed in register_commands: RuntimeError: no commands today"]
    cfg = _reef(site, "config", cwd=tmp_path)
    assert cfg.returncode == 0, cfg.stderr

