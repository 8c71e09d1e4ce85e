"""End to end through Reef's HTTP server: runtime=local answers OpenAI and Anthropic clients,
and each record keeps the token ids, sampling logprobs and adapter the runtime reported."""

from __future__ import annotations

import time

import pytest

serve_testing = pytest.importorskip("reef_core.testing")


@pytest.fixture(scope="module")
def reef(tiny_model_dir, tmp_path_factory):
    overrides = ["runtime=local", f"runtime.model={tiny_model_dir}", "runtime.max_new_tokens_default=8", "runtime.device=cpu"]
    with serve_testing.ReefServer(tmp_path_factory.mktemp("reef-local"), overrides) as server:
        yield server


def served(reef) -> str:
    """The name the local runtime serves (the model directory's); requests naming another one get 404."""
    return reef.reef.runtime.model_id


def wait_record(reef, record_id):
    for _ in range(400):
        rec = reef.store.get_record(record_id)
        if rec is not None:
            return rec
        time.sleep(0.01)
    raise AssertionError(f"record {record_id} never stored")


def test_openai_client_and_recorded_tokens(reef):
    client = reef.openai()
    raw = client.chat.completions.with_raw_response.create(
        model=served(reef), messages=[{"role": "user", "content": "hello"}], temperature=0, max_tokens=6)
    out = raw.parse()
    assert out.choices[0].finish_reason in ("stop", "length")
    rec = wait_record(reef, raw.headers["x-reef-agent-record-id"])
    assert rec.status == "ok" and rec.runtime == "local"
    assert len(rec.response_token_ids) == out.usage.completion_tokens == len(rec.logprobs)
    assert len(rec.prompt_token_ids) == out.usage.prompt_tokens
    assert rec.adapter is None

    chunks = list(client.chat.completions.create(
        model=served(reef), messages=[{"role": "user", "content": "hello"}], temperature=0, max_tokens=6, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == out.choices[0].message.content


def test_anthropic_client_is_translated(reef):
    msg = reef.anthropic().messages.create(
        model=served(reef), max_tokens=6, messages=[{"role": "user", "content": "hello"}])
    assert msg.content[0].type == "text" and msg.usage.output_tokens >= 1


def test_invalid_parameter_is_a_400_for_the_client(reef):
    body = {"model": served(reef), "messages": [{"role": "user", "content": "x"}], "n": 3}
    r = reef.client().post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert "'n' must be 1" in r.json()["error"]["message"]
