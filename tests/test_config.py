"""Hydra composition, validation with one-line errors, secret masking."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from reef_core.config import compose, load_settings, mask_secrets, masked_yaml
from reef_core.errors import ConfigError


def test_defaults_compose_to_the_documented_keys(tmp_path):
    s = load_settings([f"server.state_dir={tmp_path}"])
    assert s.server.port == 8900 and s.server.host == "127.0.0.1"
    assert s.server.default_scenario == "default"
    assert s.group("recipe")[0] == "basic"
    assert s.group("runtime")[0] == "upstream"
    assert s.group("artifact_store")[0] == "git"
    assert s.record_store_url == f"sqlite:///{tmp_path / 'reef.db'}"


def test_overrides_and_per_scenario_settings(tmp_path):
    s = load_settings([
        "server.port=9001",
        "runtime.upstream_url=http://127.0.0.1:1/v1",
        "recipe=feedback_rules",
        "evaluator=always",
        "+scenarios.support.evaluator=always",
        "+scenarios.support.recipe_options.batch_size=3",
    ])
    assert s.server.port == 9001
    assert s.runtime["upstream_url"] == "http://127.0.0.1:1/v1"
    assert s.scenarios["support"].evaluator == "always"
    assert s.scenarios["support"].recipe_options == {"batch_size": 3}


@pytest.mark.parametrize(
    "override, key",
    [
        ("server.nope=1", "server.nope"),
        ("+server.nope=1", "server.nope"),
        ("+record_store.nope=1", "record_store.nope"),
        ("record_store.synchronous=off", "record_store.synchronous"),
        ("server.port=notanumber", "server.port"),
        ("+runtime.bogus=1", "runtime.bogus"),
        ("recipe=no_such_recipe", "no_such_recipe"),
        ("auth.tokens=[{token: x, role: superuser}]", "auth.tokens.0.role"),
        ("+scenarios.x.evaluator=no_such_eval", "no_such_eval"),
    ],
)
def test_invalid_config_names_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_settings([override])
    assert key in str(err.value)
    assert "\n" not in str(err.value)


def test_env_interpolation_and_reef_token(monkeypatch):
    monkeypatch.setenv("REEF_UPSTREAM_API_KEY", "sk-secret-123")
    monkeypatch.setenv("REEF_TOKEN", "admintoken")
    s = load_settings([])
    assert s.runtime["api_key"] == "sk-secret-123"
    assert [(t.token, t.role) for t in s.auth.tokens] == [("admintoken", "admin")]


def test_masking_hides_every_secret(monkeypatch):
    monkeypatch.setenv("REEF_UPSTREAM_API_KEY", "sk-secret-123")
    monkeypatch.setenv("REEF_DATABASE_URL", "postgresql://me:pg-pass@db/reef")
    cfg = compose(["auth.tokens=[{token: tok-abc, role: infer}]", "record_store=postgres"])
    text = masked_yaml(cfg)
    for secret in ("sk-secret-123", "tok-abc", "pg-pass"):
        assert secret not in text
    assert "****" in text and "role: infer" in text
    assert mask_secrets({"nested": {"Authorization": "Bearer x"}}) == {"nested": {"Authorization": "****"}}


@pytest.mark.parametrize("url,masked", [
    ("http://u:p@h/v1", "http://u:****@h/v1"),
    ("http://u:p@ss@h/v1", "http://u:****@h/v1"),
    ("http://:tok@h", "http://****@h"),
    ("http://tok@h/x?a=b@c", "http://****@h/x?a=b@c"),
    ("postgresql://reef:pw@db:5432/reef", "postgresql://reef:****@db:5432/reef"),
    ("http://h/v1", "http://h/v1"),
    ("postgresql://h/db?password=pw&sslmode=require", "postgresql://h/db?password=****&sslmode=require"),
    ("http://h/v1?api_key=k", "http://h/v1?api_key=****"),
    ("http://h/v1?key=k&sig=s", "http://h/v1?key=****&sig=****"),
    ("postgres//u:pw@h/db", "postgres//u:****@h/db"),  # no scheme://: mistyped, still a password
    ("http://h/v1?max_tokens=5", "http://h/v1?max_tokens=5"),
])
def test_url_credentials_are_masked_in_every_form(url, masked):
    assert mask_secrets({"url": url}) == {"url": masked}


def test_config_file_merges_over_defaults(tmp_path):
    f = tmp_path / "reef.yaml"
    f.write_text("server:\n  port: 9100\n")
    assert load_settings([], config_file=f).server.port == 9100
    f.write_text("server:\n  bogus: 1\n")
    with pytest.raises(ConfigError, match="server.bogus"):
        load_settings([], config_file=f)


def test_cli_exits_2_with_one_line_for_bad_config(tmp_path):
    env = {**os.environ, "REEF_UPSTREAM_API_KEY": "sk-secret-123"}
    bad = subprocess.run([sys.executable, "-m", "reef_core", "config", "server.nope=1"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "server.nope" in bad.stderr
    ok = subprocess.run([sys.executable, "-m", "reef_core", "config"],
                        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "sk-secret-123" not in ok.stdout and "api_key: '****'" in ok.stdout
    printed = subprocess.run([sys.executable, "-m", "reef_core", "serve", "--cfg", "job", "server.port=9200"],
                             capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert printed.returncode == 0 and "port: 9200" in printed.stdout
    assert "sk-secret-123" not in printed.stdout


def test_evaluator_defaults_to_the_recipes_own():
    s = load_settings([])
    assert s.group("evaluator") == (None, {})
    # feedback_rules is judged by task_suite unless told otherwise, so it needs held-out tasks
    with pytest.raises(ConfigError, match="evaluator.tasks"):
        load_settings(["recipe=feedback_rules"])
    ok = load_settings(["recipe=feedback_rules", "+evaluator.tasks=[{prompt: hi, expected: hello}]"])
    assert ok.group("evaluator")[1]["tasks"][0]["prompt"] == "hi"
    assert load_settings(["recipe=feedback_rules", "evaluator=always"]).group("evaluator")[0] == "always"
    # as the docs write it, without Hydra's '+': the options are the recipe's evaluator's
    plain = load_settings(["recipe=feedback_rules", "evaluator.tasks=[{prompt: hi, expected: hello}]",
                           "evaluator.repeats=2"])
    assert plain.group("evaluator") == (None, {"tasks": [{"prompt": "hi", "expected": "hello"}], "repeats": 2})
    with pytest.raises(ConfigError, match="evaluator.*tasksss"):
        load_settings(["recipe=feedback_rules", "evaluator.tasks=[{prompt: hi, expected: hello}]",
                       "evaluator.tasksss=1"])
    # a chosen evaluator keeps Hydra's strictness: its yaml lists its keys
    with pytest.raises(ConfigError, match="tasksss"):
        load_settings(["evaluator=always", "evaluator.tasksss=1"])


def test_loop_uses_the_recipe_default_evaluator(tmp_path):
    from reef_core.compose import build_reef
    from reef_core.plugins import get_plugins

    s = load_settings([f"server.state_dir={tmp_path}", "runtime.upstream_url=http://127.0.0.1:9/v1"])
    reef = build_reef(s, get_plugins())
    assert reef.learning.plan("default").evaluator_name == "always"  # basic's default_evaluator
    reef.store.close()


_STRICT_SECTIONS = ("server", "auth", "loop", "record_store")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(section=st.sampled_from(_STRICT_SECTIONS),
       name=st.from_regex(r"[a-z][a-z_]{0,12}", fullmatch=True))
@example(section="server", name="on")  # YAML 1.1 read the key as the boolean true
@example(section="loop", name="no")
def test_an_unknown_key_is_named_the_same_from_an_override_a_plus_override_and_a_file(tmp_path, section, name):
    from reef_core.config import Settings

    section_model = Settings.model_fields[section].annotation
    assume(name not in section_model.model_fields and name != "name")
    expected = f"unknown config key {section}.{name}"
    for override in (f"{section}.{name}=1", f"+{section}.{name}=1"):
        with pytest.raises(ConfigError) as err:
            load_settings([override])
        assert str(err.value) == expected
    config_file = tmp_path / "reef.yaml"
    config_file.write_text(f"{section}:\n  {name}: 1\n")
    with pytest.raises(ConfigError) as err:
        load_settings([], config_file=config_file)
    assert str(err.value) == expected


def test_a_config_file_key_is_a_string_and_its_values_keep_yaml_booleans(tmp_path):
    from reef_core.config import load_config_file

    config_file = tmp_path / "reef.yaml"
    config_file.write_text("loop:\n  enabled: no\nserver:\n  host: 'on'\nx:\n  on: yes\n  'off': 1\n  true: 2\n")
    assert OmegaConf.to_container(load_config_file(config_file)) == {
        "loop": {"enabled": False}, "server": {"host": "on"}, "x": {"on": True, "off": 1, "true": 2}}
    config_file.write_text("loop:\n  enabled: no\n")
    assert load_settings([], config_file=config_file).loop.enabled is False


@pytest.mark.parametrize("text, message", [
    ("server:\n  port: [1\n", "expected ',' or ']', but got '<stream end>' at line 3, column 1"),
    ("server:\n  port: 1\n  port: 2\n", "found duplicate key port at line 3, column 3"),
    ("\t- x\n", "found character '\\t' that cannot start any token at line 1, column 1"),
    ("- server\n", "it holds a list, not a mapping of keys (e.g. 'server:' and its keys below)"),
    ("server\n", "it holds a str, not a mapping of keys (e.g. 'server:' and its keys below)"),
])
def test_a_malformed_config_file_is_one_line_naming_where(tmp_path, text, message):
    config_file = tmp_path / "reef.yaml"
    config_file.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings([], config_file=config_file)
    assert str(err.value) == f"cannot read config {config_file}: {message}"
    cli = subprocess.run([sys.executable, "-m", "reef_core", "config", "--config", str(config_file)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert cli.returncode == 2 and cli.stderr.strip() == f"Error: cannot read config {config_file}: {message}", cli.stderr


def test_a_word_without_equals_is_not_taken_for_hydra_grammar():
    with pytest.raises(ConfigError) as err:
        compose(["foo"])
    assert str(err.value) == "'foo' is not a config override: an override is KEY=VALUE (e.g. server.port=9000)"


@pytest.mark.parametrize("overrides, where", [
    (['server.default_scenario="a/b"'], "server.default_scenario"),
    (["+scenarios={a/b: {mode: manual}}"], "scenarios.a/b"),
    (["auth.tokens=[{token: abcdefgh, role: infer, scenarios: ['..']}]"], "auth.tokens.0.scenarios"),
])
def test_a_scenario_name_no_request_could_give_is_refused(overrides, where):
    with pytest.raises(ConfigError, match="not a valid scenario name") as info:
        load_settings(overrides)
    assert str(info.value).startswith(f"{where}: ")


def test_a_token_given_twice_or_blank_is_refused(monkeypatch):
    twice = "auth.tokens=[{token: same-token, role: admin}, {token: same-token, role: infer}]"
    with pytest.raises(ConfigError, match="auth.tokens.1: the same token as auth.tokens.0"):
        load_settings([twice])
    monkeypatch.setenv("REEF_TOKEN", "dup-token")
    with pytest.raises(ConfigError, match="REEF_TOKEN: the same token as auth.tokens.0") as info:
        load_settings(["auth.tokens=[{token: dup-token, role: infer}]"])
    assert "dup-token" not in str(info.value)
    monkeypatch.delenv("REEF_TOKEN")
    with pytest.raises(ConfigError, match="auth.tokens.0: a token cannot be blank"):
        load_settings(["auth.tokens=[{token: ' ', role: admin}]"])


def test_a_state_dir_that_is_a_file_or_empty_is_refused(tmp_path):
    (tmp_path / "afile").write_text("hi")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        load_settings([f"server.state_dir={tmp_path / 'afile'}"])
    with pytest.raises(ConfigError, match="server.state_dir"):
        load_settings(["server.state_dir="])
