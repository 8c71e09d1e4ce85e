"""Read routes (scenarios, records with filters and cursors), readiness and metrics."""

from __future__ import annotations

import pytest

from reef_core.testing import ReefServer


@pytest.fixture(scope="module")
def reef(upstreams, tmp_path_factory):
    with ReefServer(tmp_path_factory.mktemp("read"), upstream=upstreams["anthropic"],
                    overrides=["server.default_scenario=main"]) as server:
        c = server.client()
        for i in range(7):
            r = c.post("/v1/chat/completions", headers={"x-reef-session": "s-even" if i % 2 == 0 else "s-odd"},
                       json={"model": "m", "messages": [{"role": "user", "content": f"turn {i}"}]})
            assert r.status_code == 200
        upstreams["anthropic"].fail(500, "boom")
        assert c.post("/v1/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": "fails"}]}).status_code == 500
        yield server


def test_scenarios_list_and_detail(reef):
    c = reef.client()
    names = [s["name"] for s in c.get("/reef/scenarios").json()["scenarios"]]
    assert "main" in names
    d = c.get("/reef/scenarios/main").json()
    assert d["name"] == "main" and d["recipe"] and d["evaluator"] and d["runtime"] == "upstream"
    assert d["head_release"] is None and d["serving_release_id"] is None
    assert d["counts"]["records"] == 8 and d["counts"]["records_by_status"] == {"ok": 7, "error": 1}
    assert "loop" in d
    r = c.get("/reef/scenarios/never-used")
    assert r.status_code == 404 and "never-used" in r.json()["error"]["message"]


def test_records_pagination_is_complete_and_ordered(reef):
    c = reef.client()
    seen, cursor = [], None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = c.get("/reef/scenarios/main/records", params=params).json()
        seen += [r["seq"] for r in page["records"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == sorted(seen, reverse=True) and len(seen) == len(set(seen)) == 8
    oldest = c.get("/reef/scenarios/main/records", params={"order": "oldest", "limit": 5}).json()
    nxt = c.get("/reef/scenarios/main/records", params={"cursor": oldest["next_cursor"], "limit": 5}).json()
    assert [r["seq"] for r in oldest["records"] + nxt["records"]] == sorted(seen)
    assert nxt["next_cursor"] is None


def test_records_filters(reef):
    c = reef.client()
    odd = c.get("/reef/scenarios/main/records", params={"session": "s-odd"}).json()["records"]
    assert len(odd) == 3 and {r["session"] for r in odd} == {"s-odd"}
    errors = c.get("/reef/scenarios/main/records", params={"status": "error"}).json()["records"]
    assert len(errors) == 1 and "boom" in errors[0]["error"]
    all_ = c.get("/reef/scenarios/main/records").json()["records"]
    assert all(r["kind"] == "inference" and "reports" in r for r in all_)
    newest = all_[0]["created_at"]
    later = c.get("/reef/scenarios/main/records", params={"since": newest}).json()["records"]
    assert [r["id"] for r in later] == [all_[0]["id"]]
    naive = c.get("/reef/scenarios/main/records", params={"since": newest.rstrip("Z")}).json()["records"]
    assert [r["id"] for r in naive] == [all_[0]["id"]]
    assert c.get("/reef/scenarios/main/records", params={"kind": "other"}).json()["records"] == []
    until = c.get("/reef/scenarios/main/records", params={"until": "2000-01-01T00:00:00Z"}).json()["records"]
    assert until == []


def test_record_not_found(reef):
    r = reef.client().get("/reef/records/rec_missing")
    assert r.status_code == 404 and "rec_missing" in r.json()["error"]["message"]


def test_readyz_and_metrics(reef):
    c = reef.client()
    ready = c.get("/readyz").json()
    assert ready == {"ok": True, "checks": {"runtime_started": True, "record_writer": True, "record_writes": True,
                                        "record_store": True}}
    text = c.get("/metrics").text
    assert 'reef_requests_total{route="openai.chat",scenario="main",status="ok"} 7.0' in text
    assert 'reef_requests_total{route="openai.chat",scenario="main",status="error"} 1.0' in text
    assert 'reef_records_written_total{status="ok"} 7.0' in text
    assert 'reef_upstream_errors_total{status="500"} 1.0' in text
    assert "reef_writer_batch_size_count" in text and "reef_request_latency_seconds_bucket" in text
