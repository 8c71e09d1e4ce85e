"""Quickstart: the official OpenAI SDK against Reef, then feedback quoting the receipt.

    scripts/serve                                   # the embedded SmolLM2, or a proxy:
    reef serve runtime.upstream_url=https://api.openai.com runtime.api_key=$OPENAI_API_KEY
    python examples/quickstart_openai.py            # REEF_URL, REEF_TOKEN, REEF_MODEL optional

The model is REEF_MODEL, else the first one Reef serves (``GET /v1/models``); a proxy that
passes names through lists none, and then ``gpt-4o-mini`` goes to the upstream. Reef answers
any other name with 404 ``model_not_found``.

A test (tests/serve/test_examples.py) runs this file against a live Reef, so it stays true.
"""

from __future__ import annotations

import os

import httpx
from openai import OpenAI

PASS_THROUGH_MODEL = "gpt-4o-mini"


def main(reef_url: str = "http://127.0.0.1:8900", token: str | None = None, model: str | None = None) -> dict:
    client = OpenAI(base_url=f"{reef_url}/v1", api_key=token or "no-token-needed-on-loopback")
    if not model:
        served = [m.id for m in client.models.list().data]
        model = served[0] if served else PASS_THROUGH_MODEL
    print("model:  ", model)
    headers = {"x-reef-scenario": "quickstart", "x-reef-session": "demo-1", "x-reef-tag-source": "quickstart"}

    # with_raw_response keeps the HTTP headers: the receipt is x-reef-agent-record-id.
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "system", "content": "Answer in one short sentence."},
                  {"role": "user", "content": "What is a coral reef?"}],
        extra_headers=headers,
    )
    completion = raw.parse()
    receipt = raw.headers["x-reef-agent-record-id"]
    print("answer: ", completion.choices[0].message.content)
    print("receipt:", receipt, "release:", raw.headers.get("x-reef-release-id", "(none yet)"))

    # Streaming: the receipt is in the headers too, and in the last chunk's "reef" field.
    with client.chat.completions.with_streaming_response.create(
            model=model, stream=True, extra_headers=headers,
            messages=[{"role": "user", "content": "And in five words?"}]) as stream:
        chunks = list(stream.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    stream_receipt = chunks[-1].model_extra["reef"]["agent_record_id"]
    print("streamed:", text, "receipt:", stream_receipt)

    # Feedback quoting both receipts (one trajectory, in order). report_id makes retries safe.
    auth = {"authorization": f"Bearer {token}"} if token else {}
    report = httpx.post(f"{reef_url}/reef/report", headers={**auth, "x-reef-scenario": "quickstart"}, json={
        "score": 1.0, "feedback": "clear and short", "references": [receipt, stream_receipt],
        "report_id": f"quickstart-{receipt}",
    })
    report.raise_for_status()
    print("report: ", report.json()["report_id"])

    record = httpx.get(f"{reef_url}/reef/records/{receipt}", headers=auth).json()
    print("record: ", record["status"], "with", len(record["reports"]), "report(s)")
    return {"receipt": receipt, "stream_receipt": stream_receipt, "report": report.json(), "record": record,
            "answer": completion.choices[0].message.content, "streamed": text}


if __name__ == "__main__":
    main(os.environ.get("REEF_URL", "http://127.0.0.1:8900"), os.environ.get("REEF_TOKEN"), os.environ.get("REEF_MODEL"))
