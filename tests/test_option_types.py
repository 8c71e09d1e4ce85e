"""Option values are checked against the plugin constructor's annotations, for every plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from reef_core.cli import main
from reef_core.config import load_settings
from reef_core.errors import ConfigError
from reef_core.plugins import instantiate, load_plugins

#: the smallest task list a task suite is built with
ONE_TASK = "[{prompt: hi, expected: hello}]"

# A third-party recipe written as plugin authors write them: postponed annotations, every
# common option type, one hint that only exists for type checkers, one unannotated option.
THIRD_PARTY = '''
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from reef_core import hookimpl

if TYPE_CHECKING:
    from not_installed_anywhere import Mystery


class TypedRecipe:
    update_target = "none"
    filters = ()
    default_evaluator = "always"

    def __init__(self, batch_size: int = 2, temperature: float = 0.7, greedy: bool = False,
                 examples_file: Path | None = None, tags: list[str] | tuple[str, ...] = (),
                 mode: Literal["append", "replace"] = "append", extra: dict[str, Any] | None = None,
                 hint: Mystery | None = None, anything: Any = None, untyped=None, limit: int = None):
        if batch_size < 1:
            raise ValueError("batch_size must be 1 or more")
        self.batch_size = batch_size

    def propose(self, batch, current, ctx):
        return None


@hookimpl
def register_recipes(register):
    register("typed", TypedRecipe)
'''


@pytest.fixture
def third_party(tmp_path, monkeypatch) -> Path:
    """A site directory holding the ``typed_plugin`` distribution, on this process's path."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "typed_plugin.py").write_text(THIRD_PARTY)
    info = site / "typed_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: typed-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[reef]\ntyped_plugin = typed_plugin\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "typed_plugin", raising=False)
    return site


def _typed(*overrides: str):
    plugins = load_plugins(env={"REEF_PLUGINS": "typed_plugin"})
    return load_settings(["recipe.name=typed", *overrides], plugins=plugins)


@pytest.mark.parametrize("override", [
    "+recipe.batch_size=3",
    "+recipe.temperature=1",            # an int where a float is annotated
    "+recipe.temperature=0.25",
    "+recipe.greedy=true",
    "+recipe.examples_file=data/examples.jsonl",   # a string where a Path is annotated
    "+recipe.examples_file=null",
    "+recipe.tags=[a,b]",               # a list where list | tuple is annotated
    "+recipe.mode=replace",
    "+recipe.extra={k: 1, nested: [1, 2]}",
    "+recipe.hint=whatever",            # a hint that cannot be resolved is not checked
    "+recipe.anything=[1, {a: b}]",     # Any
    "+recipe.untyped=7",                # no annotation
    "+recipe.limit=null",               # `x: int = None` takes null
])
def test_third_party_valid_values_pass(third_party, override):
    settings = _typed(override)
    key, _, _ = override[1:].partition("=")
    assert key.split(".")[1] in settings.recipe


@pytest.mark.parametrize("override, expected", [
    ("+recipe.batch_size=two", "int"),
    ("+recipe.batch_size=2.5", "int"),
    ("+recipe.batch_size=true", "int"),
    ("+recipe.temperature=hot", "float"),
    ("+recipe.greedy=1", "bool"),
    ("+recipe.greedy=yes", "bool"),
    ("+recipe.examples_file=3", "Path | None"),
    ("+recipe.tags=[1,2]", "list[str] | tuple[str, ...]"),
    ("+recipe.tags=one", "list[str] | tuple[str, ...]"),
    ("+recipe.mode=merge", "Literal['append', 'replace']"),
    ("+recipe.extra=[1]", "dict[str, Any] | None"),
    ("+recipe.limit=ten", "int"),
])
def test_third_party_wrong_types_name_key_and_type(third_party, override, expected):
    key = override[1:].partition("=")[0]
    with pytest.raises(ConfigError) as err:
        _typed(override)
    message = str(err.value)
    assert f"invalid config key {key}: expected {expected}," in message
    assert "typed" in message and "\n" not in message


def test_third_party_wrong_type_per_scenario(third_party):
    with pytest.raises(ConfigError, match=r"^invalid config key scenarios\.s\.recipe_options\.batch_size: expected int,"):
        _typed("+scenarios.s.recipe_options.batch_size=two")
    assert _typed("+scenarios.s.recipe_options.batch_size=4").scenarios["s"].recipe_options == {"batch_size": 4}


def test_constructor_value_error_names_the_group(third_party):
    plugins = load_plugins(env={"REEF_PLUGINS": "typed_plugin"})
    with pytest.raises(ConfigError, match=r"^invalid options in recipe for recipe 'typed': batch_size must be 1 or more$"):
        instantiate("recipe", "typed", {"batch_size": 0}, plugins)
    with pytest.raises(ConfigError, match=r"^invalid options in scenarios\.s\.recipe_options for recipe 'typed': "):
        instantiate("recipe", "typed", {"batch_size": 0}, plugins, prefix="scenarios.s.recipe_options")
    with pytest.raises(ConfigError, match=r"^invalid config key scenarios\.s\.recipe_options\.batch_size: expected int"):
        instantiate("recipe", "typed", {"batch_size": "0"}, plugins, prefix="scenarios.s.recipe_options")


@pytest.mark.parametrize("overrides, key, expected", [
    (["recipe=feedback_rules", "evaluator=always", "recipe.batch_size=two"], "recipe.batch_size", "int"),
    (["recipe=feedback_rules", "evaluator=always", "recipe.max_score=high"], "recipe.max_score", "float | None"),
    (["evaluator=threshold", "evaluator.tasks=" + ONE_TASK, "evaluator.delta=x"], "evaluator.delta", "float"),
    (["evaluator=task_suite", "evaluator.tasks=" + ONE_TASK, "evaluator.repeats=[1]"], "evaluator.repeats",
     "int | Literal['auto']"),
    (["runtime.timeout_s=soon"], "runtime.timeout_s", "float"),
    (["+runtime.model_map.a=[1]"], "runtime.model_map", "dict[str, str] | None"),
    (["artifact_store.lfs_patterns=[1]"], "artifact_store.lfs_patterns", "list[str] | tuple[str, ...]"),
    (["+scenarios.s.evaluator=threshold", "+scenarios.s.evaluator_options={tasks: " + ONE_TASK + ", margin: 1}"],
     "scenarios.s.evaluator_options.margin", None),  # threshold takes delta, not margin
    (["+scenarios.s.evaluator=task_suite", "+scenarios.s.evaluator_options={tasks: " + ONE_TASK + ", margin: wide}"],
     "scenarios.s.evaluator_options.margin", "float"),
    (["evaluator=threshold", "evaluator.tasks=" + ONE_TASK, "+scenarios.s.evaluator_options.delta=x"],
     "scenarios.s.evaluator_options.delta", "float"),
])
def test_builtin_wrong_types_fail_on_the_cli_with_one_line(tmp_path, monkeypatch, overrides, key, expected):
    # in process (a process of its own is test_serve_refuses_a_wrong_type_before_starting's)
    monkeypatch.delenv("REEF_PLUGINS", raising=False)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["config", *overrides], prog_name="reef")
    assert result.exit_code == 2, (result.stderr, result.exception)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert key in lines[0]
    if expected is not None:
        assert f": expected {expected}," in lines[0]


def test_serve_refuses_a_wrong_type_before_starting(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "REEF_PLUGINS"}
    result = subprocess.run(
        [sys.executable, "-m", "reef_core", "serve", f"server.state_dir={tmp_path / 'state'}", "server.port=0",
         "recipe=feedback_rules", "evaluator=always", "recipe.batch_size=two"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == ("Error: invalid config key recipe.batch_size: expected int, got 'two' "
                                     "(recipe 'feedback_rules')")


def test_builtin_valid_values_of_each_type_pass():
    settings = load_settings([
        "recipe=feedback_rules", "evaluator=threshold", "evaluator.tasks=" + ONE_TASK,
        "recipe.batch_size=4", "recipe.max_score=1", "recipe.max_score=0.25",
        "recipe.proposer={url: 'http://127.0.0.1:1/v1', model: m}",
        "evaluator.delta=1", "+evaluator.params.temperature=0", "evaluator.model=null",
        "runtime.timeout_s=30", "+runtime.model_map.a=b", "artifact_store.lfs_patterns=['*.bin']",
        "+scenarios.s.evaluator=task_suite", "+scenarios.s.evaluator_options={tasks: " + ONE_TASK + ", margin: 1}",
    ], plugins=load_plugins(env={"REEF_PLUGINS": ""}))
    assert settings.recipe["max_score"] == 0.25
    assert settings.scenarios["s"].evaluator_options["margin"] == 1


def test_secret_values_are_not_quoted(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_settings(["runtime.api_key=12345678"], plugins=load_plugins(env={"REEF_PLUGINS": ""}))
    assert "runtime.api_key: expected str | None" in str(err.value)
    assert "12345678" not in str(err.value)


def test_in_process_objects_are_not_config_values(third_party):
    # Code may hand a constructor an object no config file can hold: the check leaves it alone.
    plugins = load_plugins(env={"REEF_PLUGINS": "typed_plugin"})
    recipe = instantiate("recipe", "typed", {"examples_file": Path("x"), "extra": {"obj": object()}}, plugins)
    assert recipe.batch_size == 2


def test_unresolvable_module_level_hint_leaves_other_hints_checked(tmp_path, monkeypatch):
    from reef_core.option_types import option_annotations

    module = tmp_path / "half_resolvable.py"
    module.write_text(textwrap.dedent("""
        from __future__ import annotations

        def build(size: int = 1, thing: NotDefinedAnywhere = None):
            return size
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import half_resolvable

    assert option_annotations(half_resolvable.build) == {"size": int}
