"""The agent harness adapters render a release into each agent's layout, installable by the
checksum-verified installer, pointing the agent at Reef without writing any token."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
import tomllib

from reef_core.builtins.harness_agents import ClaudeAdapter, CodexAdapter, OpencodeAdapter
from reef_core.commit.harness import HarnessBundle, HarnessFile


def _bundle() -> HarnessBundle:
    files = {"system.md": "You are careful.\n", "rules.md": "- Run the tests.\n",
             "skills/triage/SKILL.md": "---\nname: triage\ndescription: sort bugs\n---\nSteps.\n"}
    return HarnessBundle(scenario="agents", release_id="rel_1", content_hash="c",
                         files=tuple(HarnessFile(p, d.encode(), hashlib.sha256(d.encode()).hexdigest())
                                     for p, d in files.items()),
                         base_url="http://reef.test:8900", model="served-model")


@pytest.mark.parametrize("adapter, instructions, skill, settings", [
    (ClaudeAdapter, "CLAUDE.md", ".claude/skills/triage/SKILL.md", ".claude/settings.json"),
    (CodexAdapter, "AGENTS.md", ".codex/skills/triage/SKILL.md", ".codex/config.toml"),
    (OpencodeAdapter, "AGENTS.md", ".opencode/skills/triage/SKILL.md", "opencode.json"),
])
def test_installer_writes_the_agent_layout(tmp_path, monkeypatch, adapter, instructions, skill, settings):
    monkeypatch.setenv("REEF_TOKEN", "secret-token")
    script = tmp_path / "install.sh"
    script.write_text(adapter().render(_bundle()))
    project = tmp_path / "project"
    done = subprocess.run(["sh", str(script), str(project)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = (project / instructions).read_text()
    assert "You are careful." in text and "- Run the tests." in text and "release rel_1" in text
    assert (project / skill).read_text().endswith("Steps.\n")
    written = "".join(p.read_text() for p in project.rglob("*") if p.is_file())
    assert "secret-token" not in written and "REEF_TOKEN" in written
    raw = (project / settings).read_text()
    config = tomllib.loads(raw) if settings.endswith(".toml") else json.loads(raw)
    if adapter is ClaudeAdapter:
        assert config["env"]["ANTHROPIC_BASE_URL"] == "http://reef.test:8900"
        assert config["env"]["ANTHROPIC_CUSTOM_HEADERS"] == "x-reef-scenario: agents"
        assert config["env"]["ANTHROPIC_MODEL"] == "served-model"
    elif adapter is CodexAdapter:
        provider = config["model_providers"]["reef"]
        assert config["model_provider"] == "reef" and config["model"] == "served-model"
        assert provider["base_url"] == "http://reef.test:8900/v1" and provider["wire_api"] == "responses"
        assert provider["http_headers"] == {"x-reef-scenario": "agents"}
        assert provider["env_http_headers"] == {"x-reef-session": "REEF_SESSION"}
    else:
        options = config["provider"]["reef"]["options"]
        assert options["baseURL"] == "http://reef.test:8900/v1" and config["model"] == "reef/served-model"
        assert options["headers"]["x-reef-scenario"] == "agents"
    # a rerun is a no-op; a locally edited file is not overwritten
    assert "already current" in subprocess.run(["sh", str(script), str(project)], capture_output=True,
                                               text=True).stdout
    (project / settings).write_text("edited")
    again = subprocess.run(["sh", str(script), str(project)], capture_output=True, text=True)
    assert again.returncode == 1 and "changed since it was installed" in again.stderr


def _one(path: str) -> HarnessBundle:
    return HarnessBundle(scenario="s", release_id="r", content_hash="c",
                         files=(HarnessFile(path, b"x\n", hashlib.sha256(b"x\n").hexdigest()),))


def test_only_the_agents_own_dot_directory_is_allowed(tmp_path):
    from reef_core.builtins.harness_files import FilesAdapter

    claude = ClaudeAdapter()
    script = FilesAdapter.render(claude, _one(".claude/x"))  # the installer, without the agent layout
    (tmp_path / "ok.sh").write_text(script)
    assert subprocess.run(["sh", str(tmp_path / "ok.sh"), str(tmp_path / "p")], capture_output=True).returncode == 0
    for path in (".git/config", ".claude/../x", ".codex/x"):
        with pytest.raises(Exception, match="unsafe file path"):
            FilesAdapter.render(claude, _one(path))
    with pytest.raises(Exception, match="unsafe file path"):
        FilesAdapter().render(_one(".claude/x"))
