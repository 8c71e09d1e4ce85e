"""A report id with a receipt's shape is refused (409), by the route and by ``Reef.store_report``:
consumption keys reports and records by id alike, so a report named after another answer's
receipt held that record once it was consumed, and the reports quoting the record never trained."""

from __future__ import annotations

import pytest

from reef_core import ConflictError
from reef_core.testing import FakeUpstream, ReefServer

from .conftest import GOOD_FEEDBACK, ask, capital_model, feedback_rules_config, settings_for


def test_a_report_named_after_a_receipt_is_refused_and_every_report_on_the_record_trains(tmp_path):
    config = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={"name": "always"})
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, config)) as server:
            client = server.client()
            r1 = ask(client, "What is the capital of Italy? (1)").headers["x-reef-agent-record-id"]
            r2 = ask(client, "What is the capital of Italy? (2)").headers["x-reef-agent-record-id"]
            named = client.post("/reef/report", json={"references": [r1], "score": 0.0, "feedback": GOOD_FEEDBACK,
                                                      "report_id": r2})
            assert named.status_code == 409 and "shape of a receipt" in named.json()["error"]["message"]
            with pytest.raises(ConflictError):
                server.reef.store_report("default", [r1], score=0.0, feedback=GOOD_FEEDBACK, report_id=r2)
            assert server.store.get_report(r2) is None
            assert client.post("/reef/report", json={"references": [r1], "score": 0.0, "feedback": GOOD_FEEDBACK,
                                                     "report_id": f"mine-{r2}"}).status_code == 200
            assert client.post("/reef/report", json={"references": [r2], "score": 0.0,
                                                     "feedback": "Answer in French"}).status_code == 200
            outcomes = [client.post("/reef/scenarios/default/grow").json()["outcome"] for _ in range(2)]
            assert outcomes == ["published", "published"]  # both reports trained
