"""The real Codex CLI (pinned by scripts/agent-clis.sh) on a GPT-5-family model name, through
Reef in front of a Responses upstream (``runtime.dialect: responses``, the fake standing in for
OpenAI): the adapter pins no model, Codex sends what it sends OpenAI (its free-form
``apply_patch`` tool, hosted tools, ``store: false`` with encrypted reasoning), and on turn 2
the upstream gets turn 1's reasoning and custom tool call back exactly as it gave them. The
turns are recorded whole and can be reported on.
"""

from __future__ import annotations

import json
import subprocess

from reef_core.testing import FakeResponsesUpstream, ReefServer
from reef_core.testing import responses_items as items

from .test_agents_headless import REEF, agent_bin_dir, agent_env, receipts_of

#: a name in Codex's own model catalogue (GPT-5 family): for it Codex sends the free-form apply_patch tool
MODEL = "gpt-5.5"
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"


def test_codex_on_a_gpt5_model_through_reef_keeps_custom_tools_and_encrypted_reasoning(tmp_path):
    bin_dir = agent_bin_dir("codex")
    given: list[dict] = []  # the fake's turn-1 output, to compare with what comes back

    def responder(body):
        returned = [i for i in body["input"] if i.get("type") == "custom_tool_call_output"]
        if returned:
            return [items.reasoning("The patch is in."), items.message("Hello. Done.")]
        given[:] = [items.reasoning("Write the file first."), items.custom_tool_call("apply_patch", PATCH)]
        return given

    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    env = {**agent_env(home, bin_dir), "REEF_SCENARIO": "agents"}
    with FakeResponsesUpstream(responder) as up, ReefServer(tmp_path / "state", upstream=up) as server:
        env["REEF_URL"] = server.url

        def reef(*args: str) -> subprocess.CompletedProcess:
            done = subprocess.run([REEF, *args], cwd=project, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"reef {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
            return done

        reef("agent", "install", "codex")
        config = (project / ".codex" / "config.toml").read_text()
        assert "\nmodel =" not in config and "web_search" not in config
        ran = reef("agent", "run", "codex", "--", "exec", "--skip-git-repo-check", "-m", MODEL, "Say hello")
        assert "Hello. Done." in ran.stdout
        assert len(up.requests) >= 2
        first, second = up.requests[0], up.requests[1]
        tools = {(t["type"], t.get("name")) for t in first["tools"]}
        assert ("custom", "apply_patch") in tools and ("web_search", None) in tools
        assert first["store"] is False and "reasoning.encrypted_content" in first["include"]
        assert second["tools"] == first["tools"]  # unchanged on turn 2
        # turn 1's encrypted reasoning and custom tool call, back exactly as the upstream gave them
        back = {i.get("id"): i for i in second["input"] if i.get("type") in ("reasoning", "custom_tool_call")}
        assert back[given[0]["id"]]["encrypted_content"] == given[0]["encrypted_content"]
        call = back[given[1]["id"]]
        assert (call["name"], call["input"], call["call_id"]) == ("apply_patch", PATCH, given[1]["call_id"])

        receipts = receipts_of(ran)
        records = [server.store.get_record(r) for r in receipts]
        assert len(records) == len(up.requests) and all(r.status == "ok" for r in records)
        assert [r.request for r in records] == up.requests  # what Reef recorded is what reached the upstream
        assert records[0].response["output"] == json.loads(json.dumps(given))
        assert "on 2 receipt(s)" in reef("agent", "report", "--score", "1", "--feedback", "Good").stdout
