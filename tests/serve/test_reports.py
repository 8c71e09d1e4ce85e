"""POST /reef/report: every rule of the contract, and nothing written when refused."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def reef(reefs):
    return reefs["openai"]


def _receipt(reef, scenario="default"):
    r = reef.client().post("/v1/chat/completions", headers={"x-reef-scenario": scenario},
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    return r.headers["x-reef-agent-record-id"]


def _report_count(reef, scenario="default"):
    return reef.store.counts(scenario)["reports"]


def test_report_stored_and_listed_with_record(reef):
    a, b = _receipt(reef), _receipt(reef)
    r = reef.client().post("/reef/report", json={"score": 0.5, "feedback": {"why": "ok"}, "references": [a, b],
                                                 "metadata": {"k": 1}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["scenario"] == "default" and body["references"] == [a, b] and body["score"] == 0.5
    assert body["report_id"].startswith("rpt_")
    rec = reef.client().get(f"/reef/records/{a}").json()
    assert [x["id"] for x in rec["reports"]] == [body["report_id"]]
    assert rec["reports"][0]["metadata"] == {"k": 1} and rec["reports"][0]["feedback"] == {"why": "ok"}


def test_report_id_idempotent_retry_and_conflict(reef):
    a = _receipt(reef)
    payload = {"score": 1, "feedback": "good", "references": [a], "report_id": "my-report-1"}
    first = reef.client().post("/reef/report", json=payload)
    again = reef.client().post("/reef/report", json=payload)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    before = _report_count(reef)
    other = reef.client().post("/reef/report", json={**payload, "score": 0})
    assert other.status_code == 409
    assert "my-report-1" in other.json()["error"]["message"]
    assert _report_count(reef) == before


def test_unknown_receipt_404_names_it_and_writes_nothing(reef):
    a = _receipt(reef)
    before = _report_count(reef)
    r = reef.client().post("/reef/report", json={"score": 1, "references": [a, "rec_nope"]})
    assert r.status_code == 404
    assert "rec_nope" in r.json()["error"]["message"]
    assert _report_count(reef) == before


def test_receipt_of_other_scenario_409(reef):
    other = _receipt(reef, scenario="elsewhere")
    before = _report_count(reef)
    r = reef.client().post("/reef/report", json={"score": 1, "references": [other]})
    assert r.status_code == 409
    assert other in r.json()["error"]["message"]
    assert _report_count(reef) == before
    ok = reef.client().post("/reef/report", headers={"x-reef-scenario": "elsewhere"},
                            json={"score": 1, "references": [other]})
    assert ok.status_code == 200 and ok.json()["scenario"] == "elsewhere"


@pytest.mark.parametrize("raw", [b'{"score": NaN, "references": ["%s"]}', b'{"score": Infinity, "references": ["%s"]}',
                                 b'{"score": -1e999, "references": ["%s"]}', b'{"score": true, "references": ["%s"]}',
                                 b'{"score": "1", "references": ["%s"]}'])
def test_bad_scores_422(reef, raw):
    a = _receipt(reef)
    before = _report_count(reef)
    r = reef.client().post("/reef/report", content=raw.replace(b"%s", a.encode()),
                           headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "score" in r.json()["error"]["message"]
    assert _report_count(reef) == before


@pytest.mark.parametrize("payload,status", [
    ({"score": 1}, 422),  # references missing
    ({"score": 1, "references": []}, 422),
    ({"score": 1, "references": "rec_x"}, 422),
    ({"score": 1, "references": ["x"], "extra": 1}, 422),
    ({"feedback": 3, "references": ["x"]}, 422),
    ({"references": ["x"], "metadata": []}, 422),
    ([1, 2], 400),
])
def test_malformed_reports(reef, payload, status):
    before = _report_count(reef)
    r = reef.client().post("/reef/report", json=payload)
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) >= {"type", "message"}
    assert _report_count(reef) == before


def test_duplicate_reference_refused(reef):
    a = _receipt(reef)
    r = reef.client().post("/reef/report", json={"score": 1, "references": [a, a]})
    assert r.status_code == 409


def test_report_not_json(reef):
    r = reef.client().post("/reef/report", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
