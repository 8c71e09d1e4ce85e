"""The recipe inside a live Reef: each growth step gets the serving release and publishes on top of it."""

from __future__ import annotations

import yaml

from reef_core.testing import FakeUpstream, ReefServer, reef_settings, registered, system_prompt
from reef_recipe_few_shot import FewShotRecipe


def _chat_and_score(client, question: str) -> None:
    r = client.post("/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": question}]})
    assert r.status_code == 200, r.text
    rep = client.post("/reef/report", json={"references": [r.headers["x-reef-agent-record-id"]], "score": 1.0})
    assert rep.status_code == 200, rep.text


def test_grows_twice_in_a_row_and_publishes_twice(tmp_path):
    config = tmp_path / "reef.yaml"
    config.write_text(yaml.safe_dump({"recipe": {"name": "few_shot", "batch_size": 2},
                                      "loop": {"enabled": False, "schedule_s": None}}))
    prompts: list[str] = []

    def model(body):
        prompts.append(system_prompt(body))
        return f"answer to {body['messages'][-1]['content']}"

    # in-process stand-in for the entry point (tests/test_plugins.py checks the installed package)
    with registered("recipe", "few_shot", FewShotRecipe, plugin="few_shot"), FakeUpstream("openai", model) as up:
        settings = reef_settings(tmp_path / "state", upstream=up, config_file=config)
        with ReefServer(tmp_path, settings=settings) as server, server.client() as client:
            published = []
            for question in ("What is 2+2?", "What is 3+3?"):
                _chat_and_score(client, question)
                step = client.post("/reef/scenarios/default/grow").json()
                assert step["outcome"] == "published", step
                published.append(step["release_id"])
            releases = client.get("/reef/scenarios/default/releases").json()["releases"]
            assert [r["release_id"] for r in releases] == published[::-1]
            r = client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            assert r.headers["x-reef-release-id"] == published[1]
            assert "What is 2+2?" in prompts[-1] and "answer to What is 3+3?" in prompts[-1]
