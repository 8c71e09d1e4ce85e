"""Quickstart: the official Anthropic SDK against Reef, then feedback quoting the receipt.

    scripts/serve                                    # the embedded SmolLM2, or a proxy:
    reef serve runtime.dialect=anthropic runtime.upstream_url=https://api.anthropic.com \
        runtime.api_key=$ANTHROPIC_API_KEY
    python examples/quickstart_anthropic.py          # REEF_URL, REEF_TOKEN, REEF_MODEL optional

The model is REEF_MODEL, else the first one Reef serves (``GET /v1/models``); a proxy that
passes names through lists none, and then ``claude-haiku-4-5`` goes to the upstream. Reef
answers any other name with 404 ``model_not_found``.

Reef translates when the runtime speaks the other dialect, so this also works in front of
the embedded model or an OpenAI-compatible upstream. A test runs this file against a live Reef.
"""

from __future__ import annotations

import os

import httpx
from anthropic import Anthropic

PASS_THROUGH_MODEL = "claude-haiku-4-5"


def main(reef_url: str = "http://127.0.0.1:8900", token: str | None = None, model: str | None = None) -> dict:
    # Reef accepts the token as `Authorization: Bearer` or as the SDK's own `x-api-key`.
    client = Anthropic(base_url=reef_url, api_key=token or "no-token-needed-on-loopback")
    if not model:
        served = [m.id for m in client.models.list().data]
        model = served[0] if served else PASS_THROUGH_MODEL
    print("model:  ", model)
    headers = {"x-reef-scenario": "quickstart", "x-reef-session": "demo-2"}

    raw = client.messages.with_raw_response.create(
        model=model, max_tokens=200, system="Answer in one short sentence.",
        messages=[{"role": "user", "content": "What is a coral reef?"}], extra_headers=headers)
    message = raw.parse()
    receipt = raw.headers["x-reef-agent-record-id"]
    print("answer: ", message.content[0].text)
    print("receipt:", receipt)

    # Streaming: the receipt is in the headers, and the final message_stop event carries
    # {"reef": {"agent_record_id", "release_id"}} (raw events; the messages.stream() helper
    # rebuilds events and drops extra fields, but its .response has the headers).
    with client.messages.with_streaming_response.create(
            model=model, max_tokens=200, stream=True, extra_headers=headers,
            messages=[{"role": "user", "content": "And in five words?"}]) as response:
        stream_receipt = response.headers["x-reef-agent-record-id"]
        events = list(response.parse())
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert events[-1].type == "message_stop"
    assert events[-1].model_extra["reef"]["agent_record_id"] == stream_receipt
    print("streamed:", text, "receipt:", stream_receipt)

    auth = {"authorization": f"Bearer {token}"} if token else {}
    report = httpx.post(f"{reef_url}/reef/report", headers={**auth, "x-reef-scenario": "quickstart"}, json={
        "score": 0.0, "feedback": {"issue": "too long"}, "references": [receipt, stream_receipt],
        "report_id": f"quickstart-{receipt}",
    })
    report.raise_for_status()
    print("report: ", report.json()["report_id"])
    record = httpx.get(f"{reef_url}/reef/records/{receipt}", headers=auth).json()
    print("record: ", record["status"], "with", len(record["reports"]), "report(s)")
    return {"receipt": receipt, "stream_receipt": stream_receipt, "report": report.json(), "record": record,
            "answer": message.content[0].text, "streamed": text}


if __name__ == "__main__":
    main(os.environ.get("REEF_URL", "http://127.0.0.1:8900"), os.environ.get("REEF_TOKEN"), os.environ.get("REEF_MODEL"))
