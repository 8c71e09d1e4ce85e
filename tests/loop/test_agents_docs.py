"""docs/agents.md, run: the shell blocks it marks ``<!-- test: NAME -->`` (``setup``, then one
per agent page) run in order, line by line, with the real agent CLIs (pinned by
scripts/agent-clis.sh) in a fresh git project against a live Reef backed by the fake upstream.
The documentation's server URL is replaced by the test server's; everything else runs as
written, and each command's output and effect is checked: the adapters it lists, the release
``install`` put where the agent reads it, the recorded run carrying it, the stored report and
the rule learned from it that ``update`` installs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from reef_core.testing import FakeUpstream, ReefServer

from .conftest import feedback_rules_config, report, settings_for, wait_published
from .test_agents_headless import (
    AGENTS,
    FIRST_RULE,
    ROOT,
    agent_bin_dir,
    agent_env,
    largest,
    receipts_of,
    sent_once,
    server_block,
)

DOCS = ROOT / "docs" / "agents.md"
#: the server the page's commands name, replaced by the test server's URL
DOC_URL = "http://127.0.0.1:8900"
BLOCK = re.compile(r"^<!-- test: ([\w-]+) -->\n```sh\n(.*?)\n```", re.MULTILINE | re.DOTALL)
STEPS = ["install", "run", "report", "update"]


def marked_blocks() -> dict[str, list[str]]:
    """The marked blocks of docs/agents.md by name: their command lines, in order."""
    found: dict[str, list[str]] = {}
    for name, body in BLOCK.findall(DOCS.read_text(encoding="utf-8")):
        assert name not in found, f"docs/agents.md marks two blocks {name!r}"
        found[name] = [line for line in body.splitlines() if shlex.split(line, comments=True)]
    return found


def words(line: str) -> list[str]:
    return shlex.split(line, comments=True)


def test_each_agent_page_marks_its_commands():
    blocks = marked_blocks()
    assert sorted(blocks) == sorted({"setup", *AGENTS})
    for agent in AGENTS:
        assert [w[2] for w in map(words, blocks[agent])] == STEPS, blocks[agent]
        assert all(w[:2] == ["reef", "agent"] and w[3:4] in ([agent], ["--score"]) for w in map(words, blocks[agent]))


def test_the_tested_versions_are_the_pinned_ones():
    pins = re.search(r"^PINS=\((.*)\)$", (ROOT / "scripts" / "agent-clis.sh").read_text(), re.MULTILINE)
    assert pins is not None
    pinned = dict(pin.rsplit("@", 1) for pin in shlex.split(pins.group(1)))
    documented = dict(re.findall(r"^npm install -g (\S+) +# tested: (\S+)$", DOCS.read_text(), re.MULTILINE))
    assert documented == pinned


def _answer(body):
    return "Hello. Done."


@pytest.mark.slow  # a real agent CLI, started by Reef's CLI, against a live server
@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_agent_page_runs_as_written(tmp_path, agent):
    blocks = marked_blocks()
    bin_dir = agent_bin_dir(agent)
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    env = agent_env(home, bin_dir)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # this checkout's `reef`
    subprocess.run(["git", "init", "-q", str(project)], check=True, env=env)
    exports: list[str] = []

    with FakeUpstream("openai", _answer) as up:
        settings = settings_for(tmp_path, up, feedback_rules_config(batch_size=1, evaluator={"name": "always"}))
        with ReefServer(tmp_path, settings=settings) as server:
            client = server.client()

            def sh(line: str) -> subprocess.CompletedProcess:
                """``line`` as a user types it after the page's exports, in the project."""
                script = "\n".join(["set -eu", *exports, line.replace(DOC_URL, server.url)])
                done = subprocess.run(["bash", "-c", script], cwd=project, env=env, capture_output=True,
                                      text=True, timeout=300)
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
                return done

            for line in blocks["setup"]:
                if words(line)[0] == "export":
                    sh(line)
                    exports.append(line.replace(DOC_URL, server.url))
                else:
                    assert words(line) == ["reef", "harness", "adapters"], line
                    listed = {row.split()[0] for row in sh(line).stdout.splitlines() if row.strip()}
                    assert {"claude", "codex", "files", "opencode"} <= listed
            assert sh('printf %s "$REEF_URL"').stdout == server.url
            scenario = sh('printf %s "$REEF_SCENARIO"').stdout
            assert scenario

            # the page's prerequisite: the scenario serves a release, learned from a report
            seed = client.post("/v1/chat/completions", headers={"x-reef-scenario": scenario},
                               json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
            report(client, [seed.headers["x-reef-agent-record-id"]], score=0.0, feedback=FIRST_RULE,
                   scenario=scenario)
            release = wait_published(client, 1, scenario=scenario)[0]["release_id"]
            instructions = project / AGENTS[agent]["file"]
            receipts: list[str] = []
            learned = ""

            for line in blocks[agent]:
                step = words(line)[2]
                out = sh(line)
                if step == "install":
                    assert f"installed release {release}" in out.stdout
                    assert FIRST_RULE in instructions.read_text() and release in instructions.read_text()
                elif step == "run":
                    receipts = receipts_of(out)
                    assert receipts, out.stderr
                    records = [server.store.get_record(r) for r in receipts]
                    assert all(r.status == "ok" and r.route == AGENTS[agent]["route"] for r in records)
                    assert len({r.session for r in records}) == 1
                    serving, block = server_block(client, scenario)
                    main = largest(records)
                    assert serving == release and sent_once(main, block, release) and sent_once(main, block, FIRST_RULE)
                elif step == "report":
                    assert f"on {len(receipts)} receipt(s)" in out.stdout
                    for receipt in receipts:
                        assert len(client.get(f"/reef/records/{receipt}").json()["reports"]) == 1
                    args = words(line)
                    learned = args[args.index("--feedback") + 1]
                    release = wait_published(client, 2, scenario=scenario)[0]["release_id"]
                elif step == "update":
                    assert f"installed release {release}" in out.stdout
                    assert learned and learned in instructions.read_text() and release in instructions.read_text()
