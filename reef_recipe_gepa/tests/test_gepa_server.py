"""End to end through a real Reef: chat, report with feedback text, grow, and the published
harness holds the instruction GEPA learned. The scenario's runtime (a fake upstream whose
answers depend on the system prompt) is both the task model and the reflection model."""

from __future__ import annotations

import yaml
from gepa_doubles import KEYWORD, LESSON, TASKS

from reef_core.testing import FakeUpstream, ReefServer, reef_settings, system_prompt


def upstream_model(body):
    """Task answers depend on the harness in the system prompt; GEPA's reflection prompt gets the
    lesson the feedback teaches; the judge prompt gets a grade."""
    prompt = str(body["messages"][-1]["content"])
    if prompt.startswith("I provided an assistant"):
        return f"```\n{LESSON}\n```" if KEYWORD in prompt else "```\nAnswer carefully.\n```"
    if prompt.startswith("You grade"):
        return "1\nit names the word" if KEYWORD in prompt.rsplit("The new answer:", 1)[1] else "0\nno word"
    return f"The word is {KEYWORD}." if KEYWORD in system_prompt(body) else "I cannot say."


def test_report_grow_publishes_the_learned_instruction(tmp_path):
    config = tmp_path / "reef.yaml"
    config.write_text(yaml.safe_dump({
        "recipe": {"name": "gepa", "batch_size": 3, "max_metric_calls": 20, "concurrency": 1},
        "evaluator": {"name": "task_suite", "tasks": TASKS},
        "loop": {"enabled": False, "schedule_s": None},
    }))
    with FakeUpstream("openai", upstream_model) as up:
        settings = reef_settings(tmp_path / "state", upstream=up, config_file=config)
        with ReefServer(tmp_path, settings=settings) as server, server.client() as client:
            for question in ("What is the magic word?", "Tell me the password.", "Say the secret."):
                r = client.post("/v1/chat/completions",
                                json={"model": "m", "messages": [{"role": "user", "content": question}]})
                assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "I cannot say."
                rep = client.post("/reef/report", json={
                    "references": [r.headers["x-reef-agent-record-id"]], "score": 0.0,
                    "feedback": f"Wrong: the answer must give the magic word {KEYWORD}."})
                assert rep.status_code == 200, rep.text
            step = client.post("/reef/scenarios/default/grow").json()
            assert step["outcome"] == "published", step
            r = client.post("/v1/chat/completions",
                            json={"model": "m", "messages": [{"role": "user", "content": "What is the magic word?"}]})
            assert r.headers["x-reef-release-id"] == step["release_id"]
            assert r.json()["choices"][0]["message"]["content"] == f"The word is {KEYWORD}."
            assert LESSON in system_prompt(up.requests[-1])


def test_serve_refuses_a_scenario_without_a_validation_set(tmp_path):
    """`reef serve recipe=gepa` with an evaluator that takes no tasks: exit 2, naming the key."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "reef_core", "serve", "recipe=gepa", "evaluator=always",
         f"server.state_dir={tmp_path / 'state'}", "server.port=0", "runtime.upstream_url=http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "recipe 'gepa' needs a validation set and evaluator.tasks is not set" in result.stderr


def test_an_openai_compatible_endpoint_reflects_through_dspy():
    """`reflection: {url, model, api_key}` is a `dspy.LM`; GEPA gets a `prompt -> text` callable."""
    from reef_recipe_gepa.models import DspyLM, reflection_model

    with FakeUpstream("openai", lambda body: f"```\n{LESSON}\n```") as up:
        lm = reflection_model({"url": up.url, "model": "reflector", "api_key": "k"}, None, max_tokens=64,
                              timeout_s=30)
        assert isinstance(lm, DspyLM)
        assert LESSON in lm("I provided an assistant with the following instructions")
        assert up.requests[-1]["model"] == "reflector"
