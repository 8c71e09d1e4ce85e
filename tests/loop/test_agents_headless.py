"""Claude Code and Codex, the real CLIs (pinned, installed by scripts/agent-clis.sh), run
headless against a live Reef backed by the fake upstream, driven by the commands
docs/agents.md shows: ``reef agent install``, ``run``, ``report``, ``update``.

Each run's requests are recorded with receipts under one session; the installed harness
reaches the agent (its instructions file, with the release id, is in what the agent itself
sent, not only in the server-side injection); the report on the run is stored, the loop
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

from reef_core.testing import FakeUpstream, ReefServer

from .conftest import feedback_rules_config, report, settings_for, wait_published

ROOT = Path(__file__).resolve().parents[2]
REEF = str(Path(sys.executable).with_name("reef"))
FIRST_RULE = "Rule one: end every answer with a full stop"
SECOND_RULE = "Rule two: greet the user by name"


def _cli_dir() -> Path:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: the Claude Code and Codex CLIs cannot be installed")
    out = subprocess.run([str(ROOT / "scripts" / "agent-clis.sh")], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    bin_dir = Path(subprocess.run([str(ROOT / "scripts" / "agent-clis.sh"), "--print-dir"], capture_output=True,
                                  text=True, check=True).stdout.strip()) / "node_modules" / ".bin"
    if not (bin_dir / "claude").exists() or not (bin_dir / "codex").exists():
        pytest.skip(f"the agent CLIs are not in {bin_dir} (scripts/agent-clis.sh skipped: {out.stderr.strip()})")
    return bin_dir


def _answer(body):
    return "Hello. Done."


def _sent_by_agent(record) -> str:
    """What the agent itself put in its conversation (the server-side harness goes into the
    system prompt / instructions, so it is left out)."""
    request = dict(record.request)
    for key in ("system", "instructions"):
        request.pop(key, None)
    if "messages" in request:
        request["messages"] = [m for m in request["messages"] if m.get("role") != "system"]
    return json.dumps(request)


AGENTS = {
    "claude": {"file": "CLAUDE.md", "route": "anthropic.messages", "args": ["-p", "Say hello"]},
    "codex": {"file": "AGENTS.md", "route": "openai.responses",
              "args": ["exec", "--skip-git-repo-check", "Say hello"]},
}


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_agent_runs_reports_and_updates(tmp_path, agent):
    bin_dir = _cli_dir()
    spec = AGENTS[agent]
    home = tmp_path / "home"
    project = tmp_path / "project"
    home.mkdir()
    project.mkdir()
    env = {**os.environ, "HOME": str(home), "XDG_STATE_HOME": str(home / "state"),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "REEF_SCENARIO": "agents",
           "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "NO_COLOR": "1"}
    env.pop("REEF_TOKEN", None)
    env.pop("REEF_URL", None)

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

            installed = reef("agent", "install", agent)
            assert first in installed.stdout
            instructions = (project / spec["file"]).read_text()
            assert FIRST_RULE in instructions and first in instructions
            assert "REEF_TOKEN" in " ".join(p.read_text() for p in project.rglob("*") if p.is_file()
                                            and p.suffix in (".json", ".toml"))

            ran = reef("agent", "run", agent, "--", *spec["args"])
            receipts = [line.split()[-1] for line in ran.stderr.splitlines() if line.startswith("reef: receipt ")]
            assert receipts, ran.stderr
            records = [server.store.get_record(r) for r in receipts]
            assert all(r.status == "ok" and r.route == spec["route"] for r in records)
            sessions = {r.session for r in records}
            assert len(sessions) == 1 and sessions.pop().startswith(f"{agent}-")
            main = max(records, key=lambda r: len(json.dumps(r.request)))
            assert first in _sent_by_agent(main) and FIRST_RULE in _sent_by_agent(main)

            reported = reef("agent", "report", "--score", "0", "--feedback", SECOND_RULE)
            assert f"on {len(receipts)} receipt(s)" in reported.stdout
            again = reef("agent", "report", "--score", "0", "--feedback", SECOND_RULE)  # a retry: the same report
            assert again.stdout == reported.stdout
            stored = client.get("/reef/scenarios/agents/records", params={"session": records[0].session}).json()
            assert all(len(r["reports"]) == 1 for r in stored["records"])

            second = wait_published(client, 2, scenario="agents")[0]["release_id"]
            assert "installed release" in reef("agent", "update", agent).stdout
            assert SECOND_RULE in (project / spec["file"]).read_text()
            assert "already current" in reef("agent", "update", agent).stdout

            ran = reef("agent", "run", agent, "--", *spec["args"])
            receipts = [line.split()[-1] for line in ran.stderr.splitlines() if line.startswith("reef: receipt ")]
            main = max((server.store.get_record(r) for r in receipts), key=lambda r: len(json.dumps(r.request)))
            assert second in _sent_by_agent(main) and SECOND_RULE in _sent_by_agent(main)
            assert main.release_id == second
