"""The agent harness adapters render a release into each agent's layout, installable by the
checksum-verified installer, pointing the agent at Reef without writing any token."""

from __future__ import annotations

import hashlib
import json
import shutil
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
        assert config["env"]["ANTHROPIC_CUSTOM_HEADERS"] == "x-reef-scenario: agents\nx-reef-installed-release: rel_1"
        assert config["env"]["ANTHROPIC_MODEL"] == "served-model"
    elif adapter is CodexAdapter:
        provider = config["model_providers"]["reef"]
        assert config["model_provider"] == "reef" and config["model"] == "served-model"
        assert provider["base_url"] == "http://reef.test:8900/v1" and provider["wire_api"] == "responses"
        assert provider["http_headers"] == {"x-reef-scenario": "agents", "x-reef-installed-release": "rel_1"}
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


def _release(release_id: str, rules: str) -> HarnessBundle:
    files = {"system.md": "You are careful.\n", "rules.md": rules,
             "skills/triage/SKILL.md": "---\nname: triage\ndescription: sort bugs\n---\nSteps.\n"}
    return HarnessBundle(scenario="agents", release_id=release_id, content_hash=release_id,
                         files=tuple(HarnessFile(p, d.encode(), hashlib.sha256(d.encode()).hexdigest())
                                     for p, d in files.items()),
                         base_url="http://reef.test:8900", model="served-model")


def _install(tmp_path, adapter, bundle, project) -> subprocess.CompletedProcess:
    script = tmp_path / f"{adapter.adapter_name}-{bundle.release_id}.sh"
    script.write_text(adapter().render(bundle))
    return subprocess.run(["sh", str(script), str(project)], capture_output=True, text=True)


@pytest.mark.parametrize("order", [("claude", "codex", "opencode"), ("opencode", "claude", "codex")])
def test_claude_codex_and_opencode_install_and_update_side_by_side(tmp_path, order):
    """One project holds all three agents: each adapter keeps its own manifest and record, and
    Codex and opencode share ``AGENTS.md`` (the same bytes from the same release), so updating
    one of them first does not make the other's update refuse a 'changed' file."""
    adapters = {a.adapter_name: a for a in (ClaudeAdapter, CodexAdapter, OpencodeAdapter)}
    project = tmp_path / "project"
    for release, rules in (("rel_1", "- Run the tests.\n"), ("rel_2", "- Run the tests.\n- Be brief.\n")):
        for name in order:
            done = _install(tmp_path, adapters[name], _release(release, rules), project)
            assert done.returncode == 0, (release, name, done.stderr)
            assert f"installed release {release}" in done.stdout
        for name in order:
            manifest = f".reef-harness-{name}.sha256"
            assert subprocess.run(["sha256sum", "-c", manifest], cwd=project, capture_output=True).returncode == 0
            assert f"release_id={release}\n" in (project / f".reef-harness-{name}-release").read_text()
            again = _install(tmp_path, adapters[name], _release(release, rules), project)
            assert again.returncode == 0 and "already current" in again.stdout, again.stderr
        assert f"release {release}" in (project / "AGENTS.md").read_text()
        assert f"release {release}" in (project / "CLAUDE.md").read_text()
    assert not (project / ".reef-harness.sha256").exists()
    # a local edit of the shared file is still a change for both
    (project / "AGENTS.md").write_text("mine\n")
    for name in ("codex", "opencode"):
        edited = _install(tmp_path, adapters[name], _release("rel_3", "- x\n"), project)
        assert edited.returncode == 1 and "AGENTS.md was changed since it was installed" in edited.stderr


def test_a_second_agent_installs_over_the_shared_file_another_agent_installed_at_an_older_release(tmp_path):
    """opencode installed release 1; Codex, first installed at release 2, finds AGENTS.md as
    opencode's manifest lists it: Reef's file, not the user's (it was refused as not Reef's)."""
    project = tmp_path / "project"
    assert _install(tmp_path, OpencodeAdapter, _release("rel_1", "- one\n"), project).returncode == 0
    done = _install(tmp_path, CodexAdapter, _release("rel_2", "- two\n"), project)
    assert done.returncode == 0, done.stderr
    assert "release rel_2" in (project / "AGENTS.md").read_text()
    (project / "AGENTS.md").write_text("mine\n")  # a user's file is still refused
    mine = _install(tmp_path, ClaudeAdapter, _release("rel_2", "- two\n"), project)
    assert mine.returncode == 0  # claude does not write AGENTS.md
    shutil.rmtree(project)
    project.mkdir()
    (project / "AGENTS.md").write_text("mine\n")
    refused = _install(tmp_path, CodexAdapter, _release("rel_2", "- two\n"), project)
    assert refused.returncode == 1 and "exists and was not installed by Reef" in refused.stderr


@pytest.mark.parametrize("adapter, settings", [(ClaudeAdapter, ".claude/settings.json"),
                                               (CodexAdapter, ".codex/config.toml"),
                                               (OpencodeAdapter, "opencode.json")])
def test_each_agent_sends_the_release_it_installed(adapter, settings):
    """``x-reef-installed-release`` names the installed release (so Reef does not inject it
    again); before the first release there is none to name."""
    def headers(bundle):
        raw = next(f.data.decode() for f in adapter().layout(bundle).files if f.path == settings)
        if adapter is ClaudeAdapter:
            lines = json.loads(raw)["env"]["ANTHROPIC_CUSTOM_HEADERS"].splitlines()
            return dict(line.split(": ", 1) for line in lines)
        if adapter is CodexAdapter:
            return tomllib.loads(raw)["model_providers"]["reef"]["http_headers"]
        return json.loads(raw)["provider"]["reef"]["options"]["headers"]

    assert headers(_release("rel_7", "- x\n"))["x-reef-installed-release"] == "rel_7"
    assert headers(_release("rel_7", "- x\n"))["x-reef-scenario"] == "agents"
    assert "x-reef-installed-release" not in headers(_release("none", "- x\n"))


@pytest.mark.parametrize("dialect, model, expected", [
    ("openai", "", "default"), ("anthropic", "", "default"), ("openai", "served", "served"),
    ("responses", "", None), ("responses", "gpt-5", "gpt-5")])
def test_codex_pins_a_model_name_only_when_reef_cannot_carry_what_codex_sends(dialect, model, expected):
    """Before a chat upstream Codex gets a model name it does not know (for the names it knows it
    sends custom tools and additional_tools, which Reef refuses there) and no web search; before a
    Responses upstream, which takes them, it keeps its own model and tools unless Reef serves a model."""
    bundle = HarnessBundle(scenario="s", release_id="r", content_hash="c", files=(), base_url="http://reef.test",
                           model=model, runtime_dialect=dialect)
    raw = next(f.data.decode() for f in CodexAdapter().layout(bundle).files if f.path == ".codex/config.toml")
    config = tomllib.loads(raw)
    assert config.get("model") == expected
    assert ("web_search" in config) == (dialect != "responses")
    assert config["model_providers"]["reef"]["wire_api"] == "responses"


def test_the_installer_says_what_the_servers_upstream_speaks(tmp_path):
    from reef_core.testing import FakeResponsesUpstream, FakeUpstream, ReefServer

    for fake in (FakeResponsesUpstream(), FakeUpstream("openai")):
        with fake as up, ReefServer(tmp_path / up.dialect, upstream=up) as reef:
            script = reef.client().get("/reef/harness/install", params={"adapter": "codex"}).text
            assert ('model = "default"' in script) == (up.dialect != "responses")
