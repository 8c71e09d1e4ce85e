"""`reef agent` where things go wrong around the agent: a cut installer, Reef's options after
the agent's name, a receipt lookup that fails after the agent ran, installed files gone."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from reef_core.cli import agent, main


def _installed(project, scenario="agents", release="rel_1"):
    project.mkdir(exist_ok=True)
    (project / "AGENTS.md").write_text("- a rule\n")
    digest = hashlib.sha256(b"- a rule\n").hexdigest()
    (project / ".reef-harness-codex.sha256").write_text(f"{digest}  AGENTS.md\n")
    (project / agent.sidecar("codex")).write_text(f"release_id={release}\ncontent_hash=c\nscenario={scenario}\n")


def test_a_cut_installer_is_never_run(tmp_path, monkeypatch):
    monkeypatch.setattr(agent, "_request", lambda *a, **k: SimpleNamespace(text="#!/bin/sh\nmkdir -p x\n"))
    with pytest.raises(agent.AgentError, match="not a whole Reef installer"):
        agent.install("codex", tmp_path / "p", url="http://127.0.0.1:9", scenario="s")
    assert not (tmp_path / "p").exists()


def test_reefs_options_after_the_agents_name_are_refused():
    result = CliRunner().invoke(main, ["agent", "run", "codex", "--url", "http://elsewhere:1", "-s", "x", "--", "hi"])
    assert result.exit_code == 2 and "--url -s after NAME would go to the agent" in result.output


def test_a_report_after_a_failed_lookup_quotes_this_run_never_the_one_before(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    project = tmp_path / "p"
    _installed(project)
    lookups = iter([["rec_first"], agent.ServerUnreachable("the server went away")])

    def receipts(url, scenario, session):
        found = next(lookups)
        if isinstance(found, Exception):
            raise found
        return found

    monkeypatch.setattr(agent, "_session_receipts", receipts)
    first = agent.run("codex", project, [], url="http://127.0.0.1:9", scenario=None, binary="true")
    assert first["receipts"] == ["rec_first"]
    with pytest.raises(agent.ServerUnreachable):
        agent.run("codex", project, [], url="http://127.0.0.1:9", scenario=None, binary="true")
    second = json.loads(agent._state_file(project).read_text())
    assert second["session"] != first["session"] and second["receipts"] is None and second["exit_code"] == 0

    monkeypatch.setattr(agent, "_session_receipts", lambda url, scenario, session: [f"rec_of_{session}"])
    sent = {}
    monkeypatch.setattr(agent, "_request", lambda method, url, **k: sent.update(k["json"]) or
                        SimpleNamespace(json=lambda: {"report_id": k["json"]["report_id"]}))
    agent.report(project, score=0.0, feedback="run two was bad", url=None)
    assert sent["references"] == [f"rec_of_{second['session']}"]
    assert sent["report_id"] == f"agent-run-{second['session']}"


def test_update_reinstalls_when_installed_files_are_gone(tmp_path, monkeypatch):
    project = tmp_path / "p"
    _installed(project)
    head = SimpleNamespace(status_code=200, headers={"x-reef-release-id": "rel_1"})
    monkeypatch.setattr(agent, "_request", lambda *a, **k: head)
    monkeypatch.setattr(agent, "install", lambda name, directory, **k: "installed release rel_1")
    assert "already current" in agent.update("codex", project, url="http://127.0.0.1:9", scenario=None)
    (project / "AGENTS.md").unlink()
    assert agent.update("codex", project, url="http://127.0.0.1:9", scenario=None) == "installed release rel_1"
