"""A value the plugin would refuse when built is refused when the configuration is checked.

``reef config`` (and every command that composes a configuration) checks option *types* from the
constructor's annotations; ranges and combinations are the plugin's own ``option_problems``
classmethod (``reef_core.contracts``), which the constructor asks too. These tests hold the two
together: the same sentence from ``load_settings`` as from building the plugin.
"""

from __future__ import annotations

import pytest

from reef_core import Recipe, option_problems, refuse_bad_options
from reef_core.config import load_settings
from reef_core.errors import ConfigError
from reef_core.plugins import check_options, get_plugins, instantiate

TASKS = "evaluator.tasks=[{prompt: hi, expected: hello}]"

# (overrides, the plugin kind and name, its options as the constructor takes them, a phrase of the sentence)
REFUSED = [
    (["recipe=sao", "recipe.lr=-1", TASKS], "recipe", "sao", {"lr": -1}, "lr must be a number above 0"),
    (["recipe=sao", "recipe.mode=grpo_dis", TASKS], "recipe", "sao", {"mode": "grpo_dis"},
     "needs n_samples_per_prompt of 2 or more"),
    (["recipe=openclaw", "recipe.lr=0"], "recipe", "openclaw", {"lr": 0}, "lr must be a number above 0"),
    (["recipe=tttd", "recipe.lora_rank=0"], "recipe", "tttd", {"lora_rank": 0}, "lora_rank must be an integer"),
    (["recipe=gepa", "recipe.batch_size=0", TASKS], "recipe", "gepa", {"batch_size": 0}, "batch_size must be 1"),
    (["recipe=skillclaw", "recipe.batch_size=-1", TASKS], "recipe", "skillclaw", {"batch_size": -1},
     "batch_size must be 0"),
    (["recipe=feedback_rules", "recipe.max_rules=0", TASKS], "recipe", "feedback_rules", {"max_rules": 0},
     "max_rules must be 1 or more"),
    (["recipe=feedback_rules", "recipe.max_score=nan", TASKS], "recipe", "feedback_rules",
     {"max_score": float("nan")}, "max_score must be a finite number"),
    (["recipe=feedback_rules", "recipe.proposer={url: 'http://h/v1', modle: m}", TASKS], "recipe", "feedback_rules",
     {"proposer": {"url": "http://h/v1", "modle": "m"}}, "proposer takes url, model, api_key and timeout_s, not modle"),
    (["recipe=feedback_rules", "recipe.proposer={url: 'ftp://h'}", TASKS], "recipe", "feedback_rules",
     {"proposer": {"url": "ftp://h"}}, "proposer.url must start with http://"),
    (["recipe=feedback_rules", TASKS, "evaluator.max_episodes=0"], "evaluator", "task_suite",
     {"tasks": [{"prompt": "hi", "expected": "hello"}], "max_episodes": 0}, "max_episodes must be 1 or more"),
    (["evaluator=threshold", "evaluator.tasks=[{prompt: hi}]", "evaluator.confidence=2"], "evaluator",
     "threshold", {"tasks": [{"prompt": "hi"}], "confidence": 2}, "confidence must be between 0 and 1"),
    (["runtime=upstream", "runtime.timeout_s=-1"], "runtime", "upstream", {"timeout_s": -1},
     "runtime.timeout_s and runtime.connect_timeout_s must be above 0"),
    (["runtime=upstream", "runtime.upstream_url=ftp://host"], "runtime", "upstream",
     {"upstream_url": "ftp://host"}, "must start with http:// or https://"),
    (["runtime=upstream", "runtime.upstream_url=http://u:pw@h:99999/v1"], "runtime", "upstream",
     {"upstream_url": "http://u:pw@h:99999/v1"}, "upstream_url is not a valid URL: it does not parse"),
    (["runtime=upstream", "runtime.upstream_url=http://"], "runtime", "upstream",
     {"upstream_url": "http://"}, "upstream_url is not a valid URL: it names no host"),
    (["runtime=upstream", "runtime.upstream_ca_bundle=/nonexistent/ca.pem"], "runtime", "upstream",
     {"upstream_ca_bundle": "/nonexistent/ca.pem"}, "upstream_ca_bundle: there is no file or directory"),
    (["recipe=feedback_rules", "evaluator=task_suite", "evaluator.tasks=/nonexistent/tasks.jsonl"], "evaluator",
     "task_suite", {"tasks": "/nonexistent/tasks.jsonl"}, "cannot read evaluation tasks file"),
    (["recipe=feedback_rules", "evaluator=task_suite", "evaluator.tasks=[{prompt: hi}]"], "evaluator",
     "task_suite", {"tasks": [{"prompt": "hi"}]}, "uses grader 'contains' and needs 'expected'"),
    (["runtime=local", "runtime.max_batch_size=0"], "runtime", "local", {"max_batch_size": 0},
     "runtime.max_batch_size must be at least 1"),
    (["runtime=sglang", "runtime.engine_urls=[http://a:1, http://a:1]"], "runtime", "sglang",
     {"engine_urls": ["http://a:1", "http://a:1"]}, "runtime.engine_urls lists an engine twice"),
    (["artifact_store.lfs_url=https://lfs.example.test"], "artifact_store", "git",
     {"lfs_url": "https://lfs.example.test"}, "artifact_store.lfs_url needs artifact_store.remote"),
]


@pytest.mark.parametrize("overrides, kind, name, options, phrase", REFUSED,
                         ids=[f"{r[2]}-{next(iter(r[3]))}" if r[1] != "evaluator" else r[2] for r in REFUSED])
def test_the_config_check_refuses_what_building_refuses(overrides, kind, name, options, phrase, tmp_path):
    with pytest.raises(ConfigError) as checked:
        load_settings(overrides)
    message = str(checked.value)
    assert phrase in message and f"{kind.replace('_', ' ')} {name!r}" in message and "\n" not in message
    # serve's build of it says the same sentence, as does the constructor itself, before anything starts
    with pytest.raises(ConfigError) as built:
        instantiate(kind, name, dict(options), get_plugins(), state_dir=str(tmp_path))
    assert str(built.value) == message
    with pytest.raises(ValueError) as constructed:
        get_plugins().get(kind, name)(**options)
    assert phrase in str(constructed.value) and message.endswith(str(constructed.value))

def test_valid_values_pass_and_defaults_are_filled_in():
    # every built-in plugin that checks its values accepts its own defaults
    for overrides in (["recipe=sao", TASKS], ["recipe=openclaw"], ["recipe=tttd"], ["recipe=gepa", TASKS],
                      ["recipe=skillclaw", TASKS], ["recipe=feedback_rules", TASKS], ["runtime=local"],
                      ["runtime=upstream", "runtime.upstream_url=https://example.test/v1"]):
        load_settings(overrides)
    # a scenario's own options are checked over the root group's, under their full key
    with pytest.raises(ConfigError, match=r"scenarios\.s\.recipe_options .*batch_size must be 1"):
        load_settings(["recipe=feedback_rules", TASKS, "+scenarios.s.recipe_options.batch_size=0"])


class _Checked(Recipe):
    """A third-party recipe with its own value check (a test double: it never proposes)."""

    update_target = "harness"
    filters = ()
    default_evaluator = "always"

    def __init__(self, batch_size: int = 4, low: float = 0.0, high: float = 1.0):
        refuse_bad_options(type(self), locals())
        self.batch_size = batch_size

    @classmethod
    def option_problems(cls, o):
        problems = []
        if o["batch_size"] < 1:
            problems.append("batch_size must be 1 or more")
        if not o["low"] < o["high"]:
            problems.append(f"low ({o['low']}) must be below high ({o['high']})")
        return problems

    def propose(self, batch, current, ctx):
        return None


class _Broken(_Checked):
    @classmethod
    def option_problems(cls, o):
        return [str(o["high"] + "x")]  # a float plus a string: TypeError


class _Faulty(_Checked):
    @classmethod
    def option_problems(cls, o):
        return [o["no_such_option"]]  # KeyError: a bug in the plugin's check


class _Unchecked(Recipe):
    update_target = "harness"
    filters = ()
    default_evaluator = "always"
    batch_size = 1

    def __init__(self, batch_size: int = 1):
        pass

    def propose(self, batch, current, ctx):
        return None


class _Plugins:
    def __init__(self, **classes):
        self.classes = classes

    def get(self, kind, name):
        return self.classes[name]


def test_the_kernel_asks_a_plugin_classs_own_check_with_defaults_filled_in():
    plugins = _Plugins(checked=_Checked, broken=_Broken, faulty=_Faulty, unchecked=_Unchecked)
    check_options("recipe", "checked", {"low": 0.5}, plugins)  # high's default 1.0: fine
    with pytest.raises(ConfigError) as err:
        check_options("recipe", "checked", {"low": 2.0, "batch_size": 0}, plugins,
                      prefix="scenarios.a.recipe_options")
    assert str(err.value) == ("invalid options in scenarios.a.recipe_options for recipe 'checked': batch_size must be "
                              "1 or more; low (2.0) must be below high (1.0)")
    # an exception in the check is one problem, never a crash
    with pytest.raises(ConfigError, match="for recipe 'broken': unsupported operand"):
        check_options("recipe", "broken", {}, plugins)
    with pytest.raises(ConfigError, match=r"for recipe 'faulty': its option check failed \(KeyError: 'no_such_option'\)"):
        check_options("recipe", "faulty", {}, plugins)
    check_options("recipe", "unchecked", {"batch_size": -5}, plugins)  # no check of its own: types only
    assert option_problems(_Unchecked, {"batch_size": -5}) == []
    # the constructor says the same sentence
    with pytest.raises(ValueError, match=r"^batch_size must be 1 or more; low \(2.0\) must be below high"):
        _Checked(batch_size=0, low=2.0)
    assert _Checked(low=0.5).batch_size == 4
