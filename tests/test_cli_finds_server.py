"""The CLI run with no arguments in the directory where ``reef serve`` was started (with
overrides: another state directory, recipe, upstream and default scenario) talks to that
server and uses its configuration, silently; stopped, the same commands read its state with
its configuration; a server named but not reachable is exit 2 with one clear line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from loop.conftest import GOOD_FEEDBACK, ask, capital_model, feedback_rules_config, report

from reef_core import served_config
from reef_core.config import mask_secrets
from reef_core.testing import FakeUpstream
from reef_core.testing.serve_process import ServeProcess, free_port

CONFIG = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={"name": "always"})


def _reef(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("REEF_URL", "REEF_TOKEN", "REEF_UPSTREAM_URL")}
    return subprocess.run([sys.executable, "-m", "reef_core", *args], capture_output=True, text=True, cwd=cwd,
                          env={**environ, **env}, timeout=120)


def _silent(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stderr
    assert "note:" not in done.stderr and "given" not in done.stderr, done.stderr


def test_commands_run_where_the_server_was_started_use_it_and_its_config(tmp_path):
    here = tmp_path / "project"
    with FakeUpstream("openai", capital_model) as up:
        server = ServeProcess(here, CONFIG, [f"runtime.upstream_url={up.url}", "runtime.model=fake-model",
                                             "server.default_scenario=demo", "server.log_level=warning"],
                              cwd=here, ready_timeout=120)
        with server:
            receipt = ask(server.http, "What is the capital of Japan?", scenario="demo").headers[
                "x-reef-agent-record-id"]
            report(server.http, [receipt], score=0.0, feedback=GOOD_FEEDBACK, scenario="demo")
            grown = _reef(here, "grow")
            _silent(grown)
            assert grown.stdout.startswith("demo: published"), grown.stdout

            listed = _reef(here, "releases", "--json")
            _silent(listed)
            [release] = json.loads(listed.stdout)
            assert f"sent to the running server at {server.url}" in listed.stderr
            table = _reef(here, "releases")
            _silent(table)
            assert release["release_id"] in table.stdout and "no releases" not in table.stdout

            status = _reef(here, "status", "--json")
            _silent(status)
            [row] = [r for r in json.loads(status.stdout) if r["scenario"] == "demo"]
            assert row["serving_release_id"] == release["release_id"]

            records = _reef(here, "records", "list")
            _silent(records)
            assert receipt in records.stdout

            installed = _reef(here, "agent", "install", "claude", str(here / "agent-project"))
            assert installed.returncode == 0 and "installed release" in installed.stdout, installed.stderr
            assert server.url in (here / "agent-project" / ".claude" / "settings.json").read_text()

            doctor = _reef(here, "doctor", "--json")
            assert "note:" not in doctor.stderr
            [runtime] = [c for c in json.loads(doctor.stdout) if c["name"].startswith("runtime")]
            assert runtime["status"] == "ok", runtime
        assert not server.running()

        # stopped: the state it served, read with its configuration (not an empty default one)
        listed = _reef(here, "releases", "--json")
        _silent(listed)
        assert [r["release_id"] for r in json.loads(listed.stdout)] == [release["release_id"]]
        status = _reef(here, "status", "--json")
        _silent(status)
        assert any(r["scenario"] == "demo" and r["serving_release_id"] == release["release_id"]
                   for r in json.loads(status.stdout))
        assert receipt in _reef(here, "records", "list").stdout

    # a server named that does not answer: exit 2, one line saying so
    dead = f"http://127.0.0.1:{free_port()}"
    for command in (["releases"], ["status"], ["grow"]):
        done = _reef(here, *command, REEF_URL=dead)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert done.stderr.strip().splitlines()[-1].startswith(f"Error: cannot reach the Reef server at {dead}")
        assert done.stdout == ""


def test_a_read_only_command_given_another_runtime_reads_the_served_state(tmp_path):
    """Overrides that differ from the served config in what does not decide where the state is
    (here the runtime) do not stop ``releases`` or ``status`` reading it."""
    here = tmp_path / "project"
    with FakeUpstream("openai", capital_model) as up:
        with ServeProcess(here, CONFIG, [f"runtime.upstream_url={up.url}", "runtime.model=fake-model",
                                         "server.log_level=warning"],
                          cwd=here, ready_timeout=120):
            pass
    state = f"server.state_dir={here / 'state'}"
    for command in ("releases", "status"):
        done = _reef(here, command, "-c", str(here / "reef.yaml"), state, "runtime.upstream_url=http://127.0.0.1:9")
        assert done.returncode == 0, done.stderr


_PLAIN_KEYS = st.sampled_from(["server.port", "runtime.model", "recipe", "runtime.upstream_url", "server.default_scenario"])
_SECRET_KEYS = st.sampled_from(["runtime.api_key", "auth.tokens.0.token", "+upstream.password", "x.client_secret"])
_VALUES = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="="), min_size=1,
                  max_size=20)


@settings(max_examples=200, deadline=None)
@given(plain=st.lists(st.tuples(_PLAIN_KEYS, _VALUES), max_size=4),
       secret=st.lists(st.tuples(_SECRET_KEYS, _VALUES), max_size=3),
       # a URL password holds no '/', '?', '#' or '@' unencoded (they would end the userinfo)
       password=st.one_of(st.none(), _VALUES.filter(lambda v: not set(v) & set("/?#@"))))
def test_the_recorded_composition_never_holds_a_secret(plain, secret, password):
    """What ``served-config.json`` records of how ``reef serve`` was composed keeps every
    override except those carrying a secret (a secret key's value, a URL's password), and says
    when it left one out: a command then composes the config given instead."""
    words = [f"{k}={v}" for k, v in plain + secret]
    if password is not None:
        words.append(f"record_store.url=postgresql://reef:{password}@db/reef")
    served_config.record_composition(None, words)
    recorded = served_config._composition
    try:
        secrets = [v for _k, v in secret] + ([password] if password is not None else [])
        secret_words = words[len(plain):]
        assert recorded["overrides"] == [f"{k}={v}" for k, v in plain if mask_secrets(v) == v]
        assert not set(recorded["overrides"]) & set(secret_words)
        assert recorded["complete"] is (not secrets and all(mask_secrets(v) == v for _k, v in plain))
    finally:
        served_config._composition = None


def test_a_served_config_composed_otherwise_is_not_recomposed(tmp_path, monkeypatch):
    """When the composition composed again here is not the served one (an environment variable
    the server had, a config file edited since), the command does not take it for the server's."""
    from reef_core.cli.common import load
    from reef_core.plugins import get_plugins
    from reef_core.served_config import ServedConfig, announce

    config = tmp_path / "reef.yaml"
    config.write_text("runtime:\n  upstream_url: http://127.0.0.1:9\n")
    monkeypatch.chdir(tmp_path)
    overrides = ("runtime.model=m1", f"server.state_dir={tmp_path / 'state'}")
    served_config.record_composition(str(config), overrides)
    try:
        _cfg, settings, _plugins = load(overrides, str(config))  # as `reef serve` composes it
        announce(settings, url=None)
    finally:
        served_config._composition = None
    served = ServedConfig.read(tmp_path / "state")
    again = served.recompose(get_plugins())
    assert again is not None and again.runtime["model"] == "m1" and again.state_dir == settings.state_dir
    config.write_text("runtime:\n  upstream_url: http://127.0.0.1:10\n")  # edited since
    assert served.recompose(get_plugins()) is None
    config.unlink()
    assert served.recompose(get_plugins()) is None


def test_a_copied_state_directory_does_not_lead_to_the_original_server(tmp_path):
    """``cp -a state copy`` copies the served-config.json of the server on ``state``: a command
    given ``copy`` must act on the copy, never send a rollback to the server of the original."""
    import shutil
    import socket

    from reef_core.served_config import ServedConfig

    state = tmp_path / "state"
    state.mkdir()
    data = {"running": True, "hostname": socket.gethostname(), "pid": os.getpid(), "state_dir": str(state),
            "url": "http://127.0.0.1:9"}
    (state / served_config.FILE_NAME).write_text(json.dumps(data))
    assert ServedConfig.read(state).server_alive()
    shutil.copytree(state, tmp_path / "copy")
    assert not ServedConfig.read(tmp_path / "copy").server_alive()


def test_a_server_that_answers_other_json_is_one_line(monkeypatch):
    """A URL that answers JSON without the fields a Reef route has: one line, never a KeyError."""
    import pytest

    from reef_core.cli.remote import RemoteReef, ServerError

    remote = RemoteReef("http://127.0.0.1:9", None, found_by="--url")
    monkeypatch.setattr(remote, "_call", lambda *a, **k: (200, {"ok": True}))
    for call in (lambda: remote.releases("default"), lambda: remote.rollback("default", "base"),
                 lambda: remote.grow("default"), remote.scenario_names, lambda: remote.mode("default"),
                 lambda: remote.candidates("default", 3)):
        with pytest.raises(ServerError, match="answered without"):
            call()
    monkeypatch.setattr(remote, "_call", lambda *a, **k: (200, ["not", "an", "object"]))
    with pytest.raises(ServerError, match="answered without 'releases'"):
        remote.releases("default")


def test_a_secret_inside_a_mapping_override_is_not_recorded():
    words = ['recipe.proposer={url: "http://h/v1", model: m, api_key: SECRETPROPOSER}',
             "+scenarios.x.recipe_options={proposer: {api_key: SECRETSCEN}}", "server.port=9000",
             "recipe.proposer={url: http://h/v1, model: m}"]
    served_config.record_composition(None, words)
    try:
        assert served_config._composition["overrides"] == words[2:]
        assert served_config._composition["complete"] is False
    finally:
        served_config._composition = None
