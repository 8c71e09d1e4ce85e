"""The receipt through each popular client's public API: the response ``id`` is the receipt
(whole answers and every stream chunk), for the openai and anthropic SDKs, LiteLLM and DSPy,
in front of an OpenAI- and an Anthropic-speaking upstream. docs/serving.md ("Getting the
receipt") shows the same per client."""

from __future__ import annotations

import os

import pytest

from reef_core.testing import FakeUpstream, ReefServer, echo, system_prompt

# LiteLLM fetches its model price list over the network at import unless told not to
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402  (it imports LiteLLM when it first calls a model)

DIALECTS = ["openai", "anthropic"]
MESSAGES = [{"role": "user", "content": "hello receipt"}]


def _reported(reef, receipt: str) -> dict:
    """The record of ``receipt`` (the request that produced it), after a report quoting it."""
    client = reef.client()
    record = client.get(f"/reef/records/{receipt}")
    assert record.status_code == 200, record.text
    assert record.json()["status"] == "ok"
    r = client.post("/reef/report", json={"references": [receipt], "score": 1.0})
    assert r.status_code in (200, 201), r.text
    return record.json()


@pytest.mark.parametrize("upstream", DIALECTS)
def test_openai_sdk_response_id_is_the_receipt(reefs, upstream):
    reef = reefs[upstream]
    raw = reef.openai().chat.completions.with_raw_response.create(model="fake-model", messages=MESSAGES)
    completion = raw.parse()
    assert completion.id == raw.headers["x-reef-agent-record-id"]
    assert _reported(reef, completion.id)["response"]["id"] == completion.id

    with reef.openai().chat.completions.with_streaming_response.create(
            model="fake-model", messages=MESSAGES, stream=True, stream_options={"include_usage": True}) as resp:
        receipt = resp.headers["x-reef-agent-record-id"]
        chunks = list(resp.parse())
    assert {c.id for c in chunks} == {receipt}  # the usage chunk and the closing receipt chunk too
    assert chunks[-1].model_extra["reef"]["agent_record_id"] == receipt
    assert _reported(reef, chunks[0].id)["response"]["choices"][0]["message"]["content"] == "echo: hello receipt"


@pytest.mark.parametrize("upstream", DIALECTS)
def test_anthropic_sdk_message_id_is_the_receipt(reefs, upstream):
    reef = reefs[upstream]
    raw = reef.anthropic().messages.with_raw_response.create(model="fake-model", max_tokens=64, messages=MESSAGES)
    message = raw.parse()
    assert message.id == raw.headers["x-reef-agent-record-id"]
    _reported(reef, message.id)

    with reef.anthropic().messages.stream(model="fake-model", max_tokens=64, messages=MESSAGES) as stream:
        final = stream.get_final_message()
        receipt = stream.response.headers["x-reef-agent-record-id"]
    assert final.id == receipt
    assert _reported(reef, final.id)["response"]["id"] == receipt


@pytest.mark.parametrize("upstream", DIALECTS)
def test_litellm_response_id_is_the_receipt(reefs, upstream):
    import litellm  # here, not at collection: 3.9 s in every worker for the one test that uses it

    reef = reefs[upstream]
    response = litellm.completion(model="openai/fake-model", api_base=f"{reef.url}/v1", api_key="unused",
                                  messages=MESSAGES)
    assert response.id.startswith("rec_")
    assert _reported(reef, response.id)["request"]["messages"] == MESSAGES

    chunks = list(litellm.completion(model="openai/fake-model", api_base=f"{reef.url}/v1", api_key="unused",
                                     messages=MESSAGES, stream=True))
    assert len({c.id for c in chunks}) == 1
    assert _reported(reef, chunks[0].id)["response"]["choices"][0]["message"]["content"] == "echo: hello receipt"


class Echo(dspy.Signature):
    """Repeat the text."""

    text: str = dspy.InputField()
    echoed: str = dspy.OutputField()


def dspy_model(body):
    """Answers DSPy's chat adapter in its field format, anything else with an echo."""
    asked = str(body.get("messages", [{}])[-1].get("content", ""))
    if "[[ ## echoed ## ]]" in system_prompt(body) + asked:
        return "[[ ## echoed ## ]]\nthrough a module\n\n[[ ## completed ## ]]"
    return echo(body)


@pytest.mark.parametrize("upstream", DIALECTS)
def test_dspy_history_holds_the_receipt(tmp_path, upstream):
    with FakeUpstream(upstream, dspy_model) as up, ReefServer(tmp_path, upstream=up) as reef:
        lm = dspy.LM("openai/fake-model", api_base=f"{reef.url}/v1", api_key="unused", cache=False)
        assert lm("hello dspy") == ["echo: hello dspy"]
        receipt = lm.history[-1]["response"].id
        assert receipt.startswith("rec_")
        assert _reported(reef, receipt)["request"]["messages"][-1]["content"] == "hello dspy"

        with dspy.context(lm=lm):
            assert dspy.Predict(Echo)(text="through a module").echoed == "through a module"
        module_receipt = lm.history[-1]["response"].id
        assert module_receipt != receipt
        assert "through a module" in str(_reported(reef, module_receipt)["request"]["messages"])
