"""The whole loop through a served Reef: a client talks in sessions (``x-reef-session``) and
never reports; the runtime records top-K only for this recipe; judged turns become computed
reports; a full batch becomes a published adapter whose metadata says why."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import yaml

from reef_core.testing import ReefServer, reef_settings
from reef_recipe_openclaw import register_judge, unregister_judge
from reef_recipe_openclaw.testing import ScriptedJudge, ScriptedTrainable


def _wait(predicate, what, timeout=90.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture()
def scripted_judge():
    register_judge("scripted", ScriptedJudge)
    yield
    unregister_judge("scripted")


def _chat(client: httpx.Client, session: str, messages: list[dict]) -> tuple[str, str]:
    r = client.post("/v1/chat/completions", headers={"x-reef-session": session},
                    json={"model": "tiny", "messages": messages})
    assert r.status_code == 200, r.text
    return r.headers["x-reef-agent-record-id"], r.json()["choices"][0]["message"]["content"]


def test_sessions_over_http_become_judged_turns_and_a_release(tmp_path, tiny_model_dir, scripted_judge):
    config = {"recipe": {"name": "openclaw", "batch_size": 2, "judge": {"name": "scripted"}, "lr": 0.001,
                         "lora_rank": 4, "lora_alpha": 8, "top_k": 3, "max_staleness": 1},
              "loop": {"enabled": True, "schedule_s": None}}
    (tmp_path / "reef.yaml").write_text(yaml.safe_dump(config))
    runtime = ScriptedTrainable(tiny_model_dir, answer=lambda messages: "- a list answer")
    settings = reef_settings(tmp_path / "state", config_file=tmp_path / "reef.yaml")
    with ReefServer(tmp_path, settings=settings, runtime=runtime) as reef:
        client = reef.client()
        receipts = {}
        for session, reaction in (("alice", "no, shorter please"), ("bob", "thanks, that helps"),
                                  ("carol", "what about tomorrow?")):
            history = [{"role": "user", "content": "what is the plan?"}]
            first, reply = _chat(client, session, history)
            history += [{"role": "assistant", "content": reply}, {"role": "user", "content": reaction}]
            second, _ = _chat(client, session, history)          # binds the first turn; itself never trains
            receipts[session] = (first, second)

        rec = reef.store.get_record(receipts["alice"][0])
        assert len(rec.top_logprobs) == len(rec.response_token_ids) and len(rec.top_logprobs[0]) == 3
        assert all(call.top_logprobs == 3 for call in runtime.calls)

        # the release row comes first, the candidate's status after it: wait for the candidate
        published = _wait(lambda: next((c for c in client.get("/reef/scenarios/default/candidates").json()["candidates"]
                                        if c["status"] == "published"), None), "a published candidate")
        releases = client.get("/reef/scenarios/default/releases").json()["releases"]
        assert releases[0]["candidate_id"] == published["id"]
        why = published["artifact"]["metadata"]["openclaw"]
        assert why["dispatch"] == {"anchor": 1, "hint_eval": 1} and why["metrics"]["opd_turns"] == 2

    # alice's turn was corrected (−1 with a hint), bob's thanked (+1, anchor), carol's ambiguous: retired
    reports = {r.references[0]: r for r in reef.store.list_reports("default")}
    alice, bob = reports[receipts["alice"][0]], reports[receipts["bob"][0]]
    assert (alice.score, alice.meta["openclaw"]["dispatch"]) == (-1.0, "hint_eval")
    assert alice.meta["openclaw"]["hints"] == ["Answer in one short sentence, without lists."]
    assert alice.meta["openclaw"]["next_state"]["text"] == "no, shorter please"
    assert (bob.score, bob.meta["openclaw"]["dispatch"]) == (1.0, "anchor")
    assert receipts["carol"][0] not in reports and not any(r2 in reports for _, r2 in receipts.values())
    turns = [json.loads(line) for line in
             (tmp_path / "state" / "openclaw" / "default" / "turns.jsonl").read_text().splitlines()]
    assert sorted(t["dispatch"] for t in turns) == ["anchor", "hint_eval", "retired"]
    batch = json.loads((tmp_path / "state" / "openclaw" / "default" / "batches.jsonl").read_text().splitlines()[0])
    assert batch["candidate"] and batch["dispatch"] == {"anchor": 1, "hint_eval": 1}


def test_a_runtime_training_cannot_reach_is_refused_at_start(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("REEF_PLUGINS", "REEF_UPSTREAM_URL")}
    result = subprocess.run([sys.executable, "-m", "reef_core", "serve", "recipe=openclaw",
                             "runtime.upstream_url=http://127.0.0.1:9", "server.port=0",
                             f"server.state_dir={tmp_path / 'state'}"], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "recipe 'openclaw'" in lines[0] and "runtime=upstream" in lines[0], result.stderr
