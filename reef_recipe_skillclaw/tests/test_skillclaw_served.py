"""End to end through a real Reef: a day of chats and reports (one unscored), a night on
`reef grow`, and the published skill reaches the next request's system prompt."""

from __future__ import annotations

import pytest
import yaml
from skillclaw_doubles import SUMS_SKILL, ScriptedEvolver

from reef_core.testing import FakeUpstream, ReefServer, reef_settings, system_prompt


def _day(client, questions, scores):
    for question, score in zip(questions, scores, strict=True):
        r = client.post("/v1/chat/completions", headers={"x-reef-session": f"task-{question}"},
                        json={"model": "m", "messages": [{"role": "user", "content": question}]})
        assert r.status_code == 200, r.text
        rep = client.post("/reef/report", json={"references": [r.headers["x-reef-agent-record-id"]], "score": score,
                                                "feedback": "Answer with the number only."})
        assert rep.status_code == 200, rep.text


def test_a_night_through_the_runtime_publishes_the_created_skill(tmp_path):
    evolver = ScriptedEvolver(create=SUMS_SKILL)

    def upstream(body):
        prompt = str(body["messages"][-1]["content"])
        if body.get("messages") and prompt.startswith("You "):  # a night step: the scenario's runtime is the evolver
            return evolver.chat(body["messages"], temperature=body.get("temperature", 1.0), max_tokens=64)
        return "7" if "sums:" in system_prompt(body) else "The answer is seven, I think."

    config = tmp_path / "reef.yaml"
    config.write_text(yaml.safe_dump({"recipe": {"name": "skillclaw", "batch_size": 2},
                                      "evaluator": {"name": "always"},
                                      "loop": {"enabled": False, "schedule_s": None}}))
    with FakeUpstream("openai", upstream) as up:
        settings = reef_settings(tmp_path / "state", upstream=up, config_file=config)
        with ReefServer(tmp_path, settings=settings) as server, server.client() as client:
            _day(client, ["What is 3 + 4?", "What is 2 + 5?"], [0.0, -1.0])
            step = client.post("/reef/scenarios/default/grow").json()
            assert step["outcome"] == "published", step
            assert evolver.steps() == ["summarize", "summarize", "judge", "create"]
            cands = client.get("/reef/scenarios/default/candidates").json()["candidates"]
            meta = cands[0]["artifact"]["metadata"]["skillclaw"]
            assert meta["changes"] == [{"op": "create", "name": "sums", "fields": ["description", "body"]}]
            assert meta["day"]["tasks"] == 2 and meta["day"]["judged"] == 1
            tree = client.get("/reef/harness").json()
            assert any(f["path"] == "skills/sums/SKILL.md" for f in tree["files"])
            r = client.post("/v1/chat/completions",
                            json={"model": "m", "messages": [{"role": "user", "content": "What is 1 + 6?"}]})
            assert r.json()["choices"][0]["message"]["content"] == "7"
            assert "- sums: " in system_prompt(up.requests[-1])


@pytest.mark.slow
def test_the_local_model_as_agent_and_evolver(tmp_path):
    """The plumbing with SmolLM2-135M-Instruct as both: a night runs through the local runtime
    and ends in a candidate or in nothing to propose, never in an error."""
    pytest.importorskip("reef_torch")
    overrides = ["runtime=local", "runtime.device=cpu", "runtime.max_new_tokens_default=32", "recipe=skillclaw",
                 "evaluator=always", "recipe.batch_size=2", "recipe.retries=1", "recipe.summary_max_tokens=48",
                 "recipe.judge_max_tokens=64", "recipe.decide_max_tokens=96", "recipe.merge_max_tokens=96",
                 "loop.enabled=false"]
    settings = reef_settings(tmp_path / "state", overrides)
    with ReefServer(tmp_path, settings=settings) as server, server.client() as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        for question, score in (("What is 3 + 4?", 0.0), ("What is 2 + 5?", -1.0)):
            r = client.post("/v1/chat/completions", json={"model": model, "max_tokens": 16, "temperature": 0,
                                                          "messages": [{"role": "user", "content": question}]})
            assert r.status_code == 200, r.text
            client.post("/reef/report", json={"references": [r.headers["x-reef-agent-record-id"]], "score": score,
                                              "feedback": "Answer with the number only."}).raise_for_status()
        step = client.post("/reef/scenarios/default/grow", timeout=600).json()
        assert step["outcome"] in ("published", "skipped"), step
