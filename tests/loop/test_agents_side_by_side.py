"""Agents side by side, without the real CLIs (tests/loop/test_agents_headless.py runs those):
``reef agent run`` refuses an agent not installed in the project, finds the pinned CLIs in
the cache ``scripts/agent-clis.sh`` fills, and the server does not inject the harness a
client says it installed when that release is the one serving."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from reef_core.cli import agent as cli_agent
from reef_core.cli import main
from reef_core.testing import FakeUpstream, ReefServer, system_prompt

from .conftest import GOOD_FEEDBACK, ask, capital_model, feedback_rules_config, report, settings_for, wait_published


def _fake_agent(path: Path, marker: Path) -> Path:
    """An executable that records its arguments and ``CODEX_HOME`` in ``marker``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nprintf "%s\\n" "$CODEX_HOME" "$*" > {marker}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _ask_with(client, installed: str | None):
    headers = {"x-reef-installed-release": installed} if installed else {}
    r = client.post("/v1/chat/completions", headers=headers,
                    json={"model": "fake-model", "messages": [{"role": "user", "content": "Capital of Japan?"}]})
    assert r.status_code == 200, r.text
    return r


def test_the_installed_serving_release_is_not_injected_again(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, evaluator={"name": "always"}))
        with ReefServer(tmp_path, settings=settings) as server:
            client = server.client()
            r = ask(client, "What is the capital of France?")
            report(client, [r.headers["x-reef-agent-record-id"]], score=0.1, feedback=GOOD_FEEDBACK)
            head = wait_published(client, 1)[0]["release_id"]

            plain = _ask_with(client, None)
            assert GOOD_FEEDBACK in system_prompt(up.requests[-1])
            same = _ask_with(client, head)  # the agent sends this release itself (AGENTS.md, CLAUDE.md)
            assert GOOD_FEEDBACK not in system_prompt(up.requests[-1])
            older = _ask_with(client, "rel_older")  # installed long ago: the serving release is injected
            assert GOOD_FEEDBACK in system_prompt(up.requests[-1])
            for answered in (plain, same, older):  # each record still names the release it was served under
                assert answered.headers["x-reef-release-id"] == head
            stored = server.store.get_record(same.headers["x-reef-agent-record-id"])
            assert GOOD_FEEDBACK not in str(stored.request)


def test_run_refuses_an_agent_not_installed_and_finds_the_pinned_clis(tmp_path, monkeypatch):
    cache = tmp_path / "agent-clis"
    marker = tmp_path / "ran.txt"
    _fake_agent(cache / "node_modules" / ".bin" / "codex", marker)
    monkeypatch.setenv("REEF_AGENT_CLI_DIR", str(cache))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state-home"))
    monkeypatch.delenv("CODEX_HOME", raising=False)
    monkeypatch.delenv("REEF_SCENARIO", raising=False)
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, evaluator={"name": "always"}))
        with ReefServer(tmp_path, settings=settings) as server:
            project = tmp_path / "project"
            project.mkdir()
            assert "installed release none" in cli_agent.install("claude", project, url=server.url,
                                                                 scenario="default")
            runner = CliRunner()
            refused = runner.invoke(main, ["agent", "run", "-d", str(project), "--url", server.url, "-s", "default",
                                           "codex", "--", "exec", "hi"])
            assert refused.exit_code == 1
            assert refused.output.strip() == (f"Error: codex is not installed in {project}: run "
                                              f"`reef agent install codex {project}` first")
            assert not marker.exists()  # nothing was started

            # installed beside Claude Code, it runs from the cache, with its own CODEX_HOME
            cli_agent.install("codex", project, url=server.url, scenario="default")
            cli_agent.install("opencode", project, url=server.url, scenario="default")
            for name in ("claude", "codex", "opencode"):
                assert cli_agent.installed(project, name)["scenario"] == "default"
            ran = cli_agent.run("codex", project, ["exec", "hi"], url=server.url, scenario=None)
            assert ran["exit_code"] == 0
            codex_home, args = marker.read_text().splitlines()
            assert codex_home == str((project / ".codex").resolve()) and args == "exec hi"


def test_agent_binary_prefers_path_then_the_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cached = _fake_agent(cache / "node_modules" / ".bin" / "opencode", tmp_path / "m")
    on_path = _fake_agent(tmp_path / "bin" / "opencode", tmp_path / "m")
    monkeypatch.setenv("REEF_AGENT_CLI_DIR", str(cache))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}/usr/bin:/bin")
    assert cli_agent.agent_binary("opencode") == "opencode"  # on PATH: as given, PATH finds it
    on_path.unlink()
    assert cli_agent.agent_binary("opencode") == str(cached)
    cached.unlink()
    assert cli_agent.agent_binary("opencode") == "opencode"
    with pytest.raises(cli_agent.AgentError, match="not installed: not on PATH nor in") as refused:
        project = tmp_path / "p"
        project.mkdir()
        (project / ".reef-harness-opencode-release").write_text("release_id=none\nscenario=default\n")
        cli_agent.run("opencode", project, [], url="http://127.0.0.1:9", scenario=None)
    assert refused.value.exit_code == 1


def test_an_agent_command_that_cannot_reach_its_server_exits_2(tmp_path):
    dead = "http://127.0.0.1:9"
    done = CliRunner().invoke(main, ["agent", "install", "claude", str(tmp_path / "p"), "--url", dead])
    assert done.exit_code == 2 and done.output.startswith(f"Error: cannot reach the Reef server at {dead}")


def test_an_agent_installed_under_the_shared_record_names_is_updated_in_place(tmp_path):
    """A project Claude Code was installed in before each agent kept its own records: Codex
    installs beside it, and Claude Code's next install adopts its old records and updates
    ``CLAUDE.md`` (instead of refusing it as a file Reef did not write)."""
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, evaluator={"name": "always"}))
        with ReefServer(tmp_path, settings=settings) as server:
            project = tmp_path / "project"
            project.mkdir()
            cli_agent.install("claude", project, url=server.url, scenario="default")
            for own, shared in zip((".reef-harness-claude.sha256", ".reef-harness-claude-release"),
                                   cli_agent.LEGACY_RECORDS):
                (project / own).rename(project / shared)
            assert "installed release none" in cli_agent.install("codex", project, url=server.url,
                                                                 scenario="default")
            assert (project / ".reef-harness.sha256").exists()  # codex's install leaves claude's records

            client = server.client()
            r = ask(client, "What is the capital of France?")
            report(client, [r.headers["x-reef-agent-record-id"]], score=0.1, feedback=GOOD_FEEDBACK)
            head = wait_published(client, 1)[0]["release_id"]
            out = cli_agent.install("claude", project, url=server.url, scenario=None)
            assert f"installed release {head}" in out
            assert GOOD_FEEDBACK in (project / "CLAUDE.md").read_text()
            assert cli_agent.installed(project, "claude")["release_id"] == head
            assert not any((project / name).exists() for name in cli_agent.LEGACY_RECORDS)
