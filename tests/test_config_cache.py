"""Remembered Hydra compositions (reef_core.config_cache): the same config and the same error as
composing in full with Hydra, for any mix of overrides; a changed config file is read again."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from reef_core import config_cache
from reef_core.config import compose
from reef_core.errors import ConfigError

OVERRIDES = [
    # config values, known and unknown, with Hydra's prefixes
    "server.port=9100", "server.host=0.0.0.0", "loop.enabled=false", "server.state_dir=/tmp/reef-x",
    "runtime.upstream_url=http://127.0.0.1:9/v1", "server.prot=1", "nope=1", "+server.extra=1",
    "++server.port=9200", "+server.port=1", "~server.port", "~server.nope", "~server.port=8000",
    "server.host=${oc.env:HOME}", "server.port=${nope}", "loop={enabled: false}", "server.port=[1, 2]",
    "recipe.batch_size=4", "recipe.lr=0.1", "evaluator.tasks=[{prompt: hi, expected: hello}]",
    "evaluator.repeats=2", "runtime.model=other",
    # config groups: chosen, unknown, added, deleted
    "runtime=upstream", "recipe=sao", "recipe=basic", "recipe=feedback_rules", "evaluator=always",
    "evaluator=task_suite", "record_store=postgres", "recipe=nonexistent", "~evaluator", "+recipe=sao",
    "recipe@server=basic", "runtime/nothing=x",
    # not plain overrides: a sweep, syntax errors
    "server.port=1,2", "server.port=[", "=1", "server port=1",
]


def _outcome(overrides: list[str]) -> tuple:
    try:
        cfg = compose(overrides)
    except ConfigError as exc:
        return "error", str(exc)
    return "ok", OmegaConf.to_yaml(cfg), OmegaConf.is_struct(cfg)


@settings(max_examples=20, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(OVERRIDES), max_size=5))
@example(["server.port=9100"])
@example(["recipe=sao", "recipe.lr=0.1", "server.port=9100"])
@example(["recipe.lr=0.1", "recipe=sao"])  # a group chosen after a value of it: Hydra composes first
@example(["server.prot=1"])
@example(["server.port=1,2"])
def test_a_remembered_composition_is_the_one_hydra_composes(monkeypatch, overrides):
    config_cache.clear()
    remembered = [_outcome(overrides), _outcome(overrides)]  # a miss, then a hit
    with monkeypatch.context() as m:
        m.setattr(config_cache, "split", lambda given, dirs: None)  # Hydra, every override
        full = _outcome(overrides)
    assert remembered == [full, full]


def test_a_composition_is_remembered_per_group_choice_and_copied(monkeypatch):
    config_cache.clear()
    calls: list[list[str]] = []
    real = config_cache.compose

    def counting(overrides, dirs, hydra_compose):
        def counted(given):
            calls.append(given)
            return hydra_compose(given)
        return real(overrides, dirs, counted)

    monkeypatch.setattr(config_cache, "compose", counting)
    first = compose(["server.port=9100"])
    first.server.port = 1  # a caller's change stays in its own copy
    second = compose(["server.port=9200"])
    third = compose(["runtime=upstream", "server.port=9300"])
    assert (second.server.port, third.server.port) == (9200, 9300)
    assert compose([]).server.port != 1
    assert [given[:-1] for given in calls] == [[], ["runtime=upstream"]]  # the last one: the search path


def test_an_edited_config_file_is_read_again(tmp_path):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    (tmp_path / "server").mkdir()
    (tmp_path / "config.yaml").write_text("defaults:\n  - server: small\n  - _self_\nname: a\n")
    option = tmp_path / "server" / "small.yaml"
    option.write_text("port: 1\n")

    def composed(given):
        with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
            return hydra_compose("config", overrides=given)

    config_cache.clear()
    assert config_cache.compose(["name=b"], [str(tmp_path)], composed).server.port == 1
    option.write_text("port: 22\n")  # another size: another key, whatever the clock's resolution
    assert config_cache.compose(["name=b"], [str(tmp_path)], composed).server.port == 22
    (tmp_path / "server" / "large.yaml").write_text("port: 3\n")
    cfg = config_cache.compose(["server=large", "name=c"], [str(tmp_path)], composed)
    assert (cfg.server.port, cfg.name) == (3, "c")


def test_the_cache_holds_a_bounded_number_of_compositions(monkeypatch):
    config_cache.clear()
    monkeypatch.setattr(config_cache, "MAX_ENTRIES", 3)  # the bound, not its size, is what is checked
    choices = [[], ["runtime=upstream"], ["recipe=sao"], ["evaluator=always"], ["recipe=basic", "record_store=sqlite"]]
    for choice in choices:
        compose(choice)
    kept = list(config_cache._cache)
    assert len(kept) == 3
    compose(["recipe=basic", "record_store=sqlite", "server.port=9100"])  # a kept choice: a hit, nothing moves
    assert list(config_cache._cache) == kept
    compose([])  # the oldest choice was dropped: composed again, it drops the next oldest
    assert len(config_cache._cache) == 3 and list(config_cache._cache)[:2] == kept[1:]
