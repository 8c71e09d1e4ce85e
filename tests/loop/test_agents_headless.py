"""Claude Code, Codex and opencode, the real CLIs (pinned, installed by
scripts/agent-clis.sh), run headless against a live Reef backed by the fake upstream, driven
by the commands docs/agents.md shows: ``reef agent install``, ``run``, ``report``, ``update``.

Each run's requests are recorded with receipts under one session; the installed harness
reaches the agent (its instructions file, with the release id, is in what the agent itself
sent, once: Reef does not inject the release the agent says it installed); the report on the run is stored, the loop
turns it into a rule, ``reef agent update`` installs that rule and the next run carries it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reef_core.commit.harness import Harness
from reef_core.testing import FakeUpstream, ReefServer

from .conftest import feedback_rules_config, report, settings_for, wait_published

ROOT = Path(__file__).resolve().parents[2]
REEF = str(Path(sys.executable).with_name("reef"))
FIRST_RULE = "Rule one: end every answer with a full stop"
SECOND_RULE = "Rule two: greet the user by name"
#: keeps the agents off the network: no update checks, no model catalogue downloads
OFFLINE_ENV = {"DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1", "NO_COLOR": "1"}


def agent_bin_dir(binary: str) -> Path:
    """The directory holding the pinned agent CLIs (installed on first use); skips when npm or
    ``binary`` is missing or does not run."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: the Claude Code, Codex and opencode CLIs cannot be installed")
    script = str(ROOT / "scripts" / "agent-clis.sh")
    out = subprocess.run([script], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    bin_dir = Path(subprocess.run([script, "--print-dir"], capture_output=True, text=True,
                                  check=True).stdout.strip()) / "node_modules" / ".bin"
    if not (bin_dir / binary).exists():
        pytest.skip(f"{binary} is not in {bin_dir} (scripts/agent-clis.sh said: {out.stderr.strip()})")
    probe = subprocess.run([str(bin_dir / binary), "--version"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"{bin_dir / binary} does not run here: {(probe.stderr or probe.stdout).strip()[:300]}")
    return bin_dir


def agent_env(home: Path, bin_dir: Path) -> dict[str, str]:
    """An environment for running agents: a fresh HOME, the pinned CLIs first on PATH."""
    env = {**os.environ, "HOME": str(home), "XDG_STATE_HOME": str(home / "state"),
           "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local" / "share"),
           "XDG_CACHE_HOME": str(home / ".cache"), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           **OFFLINE_ENV}
    for key in ("REEF_TOKEN", "REEF_URL", "REEF_SCENARIO", "REEF_SESSION", "CODEX_HOME"):
        env.pop(key, None)
    return env


def _answer(body):
    return "Hello. Done."


def server_block(client, scenario: str) -> tuple[str, str]:
    """The release the scenario serves and the block Reef injects for it in front of the
    client's system prompt (``reef_core.commit.harness.inject``)."""
    got = client.get("/reef/harness", headers={"x-reef-scenario": scenario})
    files = {f["path"]: f["content"] for f in got.json()["files"]}
    block = Harness(system=files.get("system.md", "").strip(), rules=files.get("rules.md", "").strip()).prompt()
    return got.headers["x-reef-release-id"], block


def sent_once(record, block: str, text: str) -> bool:
    """Whether ``text`` (the installed release's rule or id) is in what the agent sent exactly
    once: the agent installed the release that serves and says so (``x-reef-installed-release``),
    so Reef did not inject the harness (``block``, which holds the rule) a second time."""
    request = json.dumps(record.request)
    assert request.count(json.dumps(block)[1:-1]) <= 1, "the harness is in the request twice"
    return request.count(json.dumps(text)[1:-1]) == 1


def largest(records):
    """The agent's main turn: its largest request (side requests such as title generation are small)."""
    return max(records, key=lambda r: len(json.dumps(r.request)))


AGENTS = {
    "claude": {"file": "CLAUDE.md", "route": "anthropic.messages", "args": ["-p", "Say hello"]},
    "codex": {"file": "AGENTS.md", "route": "openai.responses",
              "args": ["exec", "--skip-git-repo-check", "Say hello"]},
    "opencode": {"file": "AGENTS.md", "route": "openai.chat", "args": ["run", "Say hello"]},
}


def receipts_of(ran: subprocess.CompletedProcess) -> list[str]:
    return [line.split()[-1] for line in ran.stderr.splitlines() if line.startswith("reef: receipt ")]


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_agent_runs_reports_and_updates(tmp_path, agent):
    bin_dir = agent_bin_dir(agent)
    spec = AGENTS[agent]
    home = tmp_path / "home"
    project = tmp_path / "project"
    home.mkdir()
    project.mkdir()
    env = {**agent_env(home, bin_dir), "REEF_SCENARIO": "agents"}

    def reef(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([REEF, *args], cwd=project, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"reef {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done

    with FakeUpstream("openai", _answer) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, evaluator={"name": "always"}))
        with ReefServer(tmp_path, settings=settings) as server:
            client = server.client()
            env["REEF_URL"] = server.url
            # a first release, from a report on a plain request
            seed = client.post("/v1/chat/completions", headers={"x-reef-scenario": "agents"},
                               json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
            report(client, [seed.headers["x-reef-agent-record-id"]], score=0.0, feedback=FIRST_RULE,
                   scenario="agents")
            first = wait_published(client, 1, scenario="agents")[0]["release_id"]
            serving, block = server_block(client, "agents")
            assert serving == first and FIRST_RULE in block

            installed = reef("agent", "install", agent)
            assert first in installed.stdout
            instructions = (project / spec["file"]).read_text()
            assert FIRST_RULE in instructions and first in instructions
            assert "REEF_TOKEN" in " ".join(p.read_text() for p in project.rglob("*") if p.is_file()
                                            and p.suffix in (".json", ".toml"))

            ran = reef("agent", "run", agent, "--", *spec["args"])
            receipts = receipts_of(ran)
            assert receipts, ran.stderr
            records = [server.store.get_record(r) for r in receipts]
            assert all(r.status == "ok" and r.route == spec["route"] for r in records)
            sessions = {r.session for r in records}
            assert len(sessions) == 1 and sessions.pop().startswith(f"{agent}-")
            main = largest(records)
            assert sent_once(main, block, first) and sent_once(main, block, FIRST_RULE)

            reported = reef("agent", "report", "--score", "0", "--feedback", SECOND_RULE)
            assert f"on {len(receipts)} receipt(s)" in reported.stdout
            again = reef("agent", "report", "--score", "0", "--feedback", SECOND_RULE)  # a retry: the same report
            assert again.stdout == reported.stdout
            stored = client.get("/reef/scenarios/agents/records", params={"session": records[0].session}).json()
            assert len(stored["records"]) == len(receipts)
            assert all(len(r["reports"]) == 1 for r in stored["records"])

            second = wait_published(client, 2, scenario="agents")[0]["release_id"]
            serving, block = server_block(client, "agents")
            assert serving == second
            assert "installed release" in reef("agent", "update", agent).stdout
            assert SECOND_RULE in (project / spec["file"]).read_text()
            assert "already current" in reef("agent", "update", agent).stdout

            ran = reef("agent", "run", agent, "--", *spec["args"])
            main = largest([server.store.get_record(r) for r in receipts_of(ran)])
            assert sent_once(main, block, second) and sent_once(main, block, SECOND_RULE)
            assert main.release_id == second
