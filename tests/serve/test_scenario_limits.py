"""Scenario names are bounded: admission (server.max_scenarios, server.scenarios_open), metric
label bounds, what a limited admin sees on /metrics, and a restart whose store queries do not
grow with the number of idle scenarios."""

from __future__ import annotations

import asyncio
import re

import pytest
from sqlalchemy import event

from reef_core.compose import build_reef
from reef_core.kernel import Reef
from reef_core.plugins import get_plugins
from reef_core.serve.app import create_app
from reef_core.serve.metrics import OTHER_SCENARIO
from reef_core.serve.scenarios import ScenarioRegistry, decode_name_cursor, encode_name_cursor
from reef_core.store import CandidateRow, Record, Release, Report, new_id
from reef_core.testing import ReefServer, reef_settings

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MSG = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
_SCENARIO_LABEL = re.compile(r'scenario="([^"]*)"')


def _chat(client, scenario: str, **kwargs):
    return client.post("/v1/chat/completions", json=kwargs.pop("json", CHAT), headers={"x-reef-scenario": scenario},
                       **kwargs)


def _report(client, scenario: str, receipt: str):
    return client.post("/reef/report", json={"score": 1, "references": [receipt]},
                       headers={"x-reef-scenario": scenario})


def _scenario_labels(text: str, metric: str) -> dict[str, float]:
    """{scenario label: value} of ``metric`` summed over its other labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            m = _SCENARIO_LABEL.search(line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


# ---------------------------------------------------------------------------- admission


def test_the_cap_refuses_new_names_in_each_route_shape_and_keeps_existing_ones(upstreams, tmp_path):
    overrides = ["server.max_scenarios=3"]
    with ReefServer(tmp_path, upstream=upstreams["openai"], overrides=overrides) as reef:
        c = reef.client()
        # A refused report and a malformed request take no slot: only served requests create.
        ok = _chat(c, "s1")
        assert ok.status_code == 200
        receipt = ok.headers["x-reef-agent-record-id"]
        assert _report(c, "ghost", receipt).status_code == 409
        assert _chat(c, "broken", content=b"{", json=None).status_code == 400
        assert _chat(c, "s2").status_code == 200  # default, s1, s2: the cap

        r = _chat(c, "s3")
        assert r.status_code == 403
        err = r.json()["error"]
        assert err["type"] == "permission_error" and err["param"] == "x-reef-scenario"
        assert "server.max_scenarios" in err["message"] and "s3" in err["message"]

        r = c.post("/v1/messages", json=MSG, headers={"x-reef-scenario": "s3"})
        assert r.status_code == 403
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] == "permission_error"
        assert "server.max_scenarios" in body["error"]["message"]

        r = _chat(c, "s3", json={**CHAT, "stream": True})
        assert r.status_code == 403 and "server.max_scenarios" in r.json()["error"]["message"]

        r = _report(c, "s4", receipt)
        assert r.status_code == 403
        assert r.json()["error"]["type"] == "forbidden" and "server.max_scenarios" in r.json()["error"]["message"]

        # existing scenarios keep working: inference, reports, the default scenario
        assert _chat(c, "s1").status_code == 200
        assert c.post("/v1/messages", json=MSG, headers={"x-reef-scenario": "s2"}).status_code == 200
        assert _report(c, "s1", receipt).status_code == 200
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert reef.store.list_records("s3") == [] and reef.store.list_records("broken") == []

    # after a restart the stored scenarios count again: the cap still holds, they still work
    with ReefServer(tmp_path, upstream=upstreams["openai"], overrides=overrides) as reef:
        c = reef.client()
        assert _chat(c, "s3").status_code == 403
        assert _chat(c, "s2").status_code == 200


def test_closed_mode_serves_only_configured_default_and_token_listed(upstreams, tmp_path):
    with ReefServer(tmp_path, upstream=upstreams["openai"]) as reef:
        assert _chat(reef.client(), "legacy").status_code == 200  # stored while scenarios were open

    tokens = [{"token": "adm", "role": "admin"}, {"token": "partner", "role": "infer", "scenarios": ["partner"]}]
    overrides = ["server.scenarios_open=false", "+scenarios.support.filters=[]"]
    with ReefServer(tmp_path, upstream=upstreams["openai"], overrides=overrides, tokens=tokens) as reef:
        adm = reef.client("adm")
        assert _chat(adm, "support").status_code == 200
        assert adm.post("/v1/chat/completions", json=CHAT).status_code == 200  # the default scenario
        assert _chat(reef.client("partner"), "partner").status_code == 200
        for name in ("legacy", "brand-new"):
            r = _chat(adm, name)
            assert r.status_code == 403, name
            err = r.json()["error"]
            assert err["param"] == "x-reef-scenario" and "server.scenarios_open" in err["message"]
        r = adm.post("/v1/messages", json=MSG, headers={"x-reef-scenario": "brand-new"})
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        assert reef.store.list_records("brand-new") == []
        # reads still show what is stored, token-listed scenarios included
        names = {s["name"] for s in adm.get("/reef/scenarios").json()["scenarios"]}
        assert {"default", "support", "partner", "legacy"} <= names


def test_registry_admission_unit():
    reg = ScenarioRegistry({"default"}, max_scenarios=2, open=True)
    reg.load(["stored-a", "stored-b"])  # stored data counts even past the cap
    assert len(reg) == 3 and "stored-b" in reg
    reg.admit("stored-a")
    with pytest.raises(Exception, match="server.max_scenarios"):
        reg.admit("new")
    closed = ScenarioRegistry({"default"}, max_scenarios=10, open=False)
    closed.load(["stored"])
    assert "stored" not in closed
    with pytest.raises(Exception, match="server.scenarios_open"):
        closed.admit("stored")
    open_ = ScenarioRegistry(set(), max_scenarios=1, open=True)
    open_.admit("probe", register=False)
    assert "probe" not in open_
    open_.admit("kept")
    assert open_.known() == {"kept"}


# ---------------------------------------------------------------------------- metrics


def test_metric_labels_stay_bounded_with_many_scenarios(upstreams, tmp_path):
    with ReefServer(tmp_path, upstream=upstreams["openai"]) as reef:
        c = reef.client()
        bound = reef.app.state.serve.metrics.scenario_labels
        receipts = {}
        for i in range(300):
            r = _chat(c, f"many-{i:03d}")
            assert r.status_code == 200
            receipts[i] = r.headers["x-reef-agent-record-id"]
        assert _chat(c, "default").status_code == 200
        assert _report(c, "many-000", receipts[0]).status_code == 200
        assert _report(c, "many-250", receipts[250]).status_code == 200

        text = c.get("/metrics").text
        requests = _scenario_labels(text, "reef_requests_total")
        assert len(requests) == bound + 2  # the first `bound` names, the pinned default, the rest
        assert requests["default"] == 1 and requests["many-000"] == 1
        assert requests[OTHER_SCENARIO] == 300 - bound
        assert sum(requests.values()) == 301
        assert _scenario_labels(text, "reef_reports_written_total") == {"many-000": 1.0, OTHER_SCENARIO: 1.0}
        assert len({v for line in text.splitlines() for v in _SCENARIO_LABEL.findall(line)}) <= bound + 2


def test_a_scenario_limited_admin_sees_only_its_scenarios_on_metrics(upstreams, tmp_path):
    tokens = [{"token": "adm", "role": "admin"}, {"token": "adm-a", "role": "admin", "scenarios": ["a"]}]
    with ReefServer(tmp_path, upstream=upstreams["openai"], tokens=tokens) as reef:
        reef.app.state.serve.metrics.scenario_labels = 1  # a is pinned (token-listed); b labelled; c, d other
        adm = reef.client("adm")
        receipts = {}
        for s in ("a", "b", "c", "d"):
            r = _chat(adm, s)
            assert r.status_code == 200
            receipts[s] = r.headers["x-reef-agent-record-id"]
            assert _report(adm, s, receipts[s]).status_code == 200

        full = adm.get("/metrics").text
        assert set(_scenario_labels(full, "reef_requests_total")) == {"a", "b", OTHER_SCENARIO}
        assert set(_scenario_labels(full, "reef_reports_written_total")) == {"a", "b", OTHER_SCENARIO}

        limited = reef.client("adm-a").get("/metrics")
        assert limited.status_code == 200
        assert {v for line in limited.text.splitlines() for v in _SCENARIO_LABEL.findall(line)} == {"a"}
        assert _scenario_labels(limited.text, "reef_requests_total") == {"a": 1.0}
        assert 'reef_records_written_total{status="ok"}' in limited.text  # not per scenario: shown


# ---------------------------------------------------------------------------- listing


def test_scenario_list_pages_by_name(upstreams, tmp_path):
    tokens = [{"token": "adm", "role": "admin"}, {"token": "rd", "role": "report", "scenarios": ["p-1", "p-3"]}]
    with ReefServer(tmp_path, upstream=upstreams["openai"], tokens=tokens) as reef:
        adm = reef.client("adm")
        for i in range(5):
            assert _chat(adm, f"p-{i}").status_code == 200
        seen, cursor = [], None
        while True:
            page = adm.get("/reef/scenarios", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
            assert len(page["scenarios"]) <= 2
            seen += [s["name"] for s in page["scenarios"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == sorted(seen) == ["default", "p-0", "p-1", "p-2", "p-3", "p-4"]
        assert all(s["head_release_id"] is None for s in adm.get("/reef/scenarios").json()["scenarios"])
        limited = reef.client("rd").get("/reef/scenarios", params={"limit": 1}).json()
        assert [s["name"] for s in limited["scenarios"]] == ["p-1"]
        rest = reef.client("rd").get("/reef/scenarios", params={"cursor": limited["next_cursor"]}).json()
        assert [s["name"] for s in rest["scenarios"]] == ["p-3"] and rest["next_cursor"] is None
        r = adm.get("/reef/scenarios", params={"cursor": "%%%"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cursor"
    assert decode_name_cursor(encode_name_cursor("a:b.c-é")) == "a:b.c-é"


# ---------------------------------------------------------------------------- restart cost


class _Statements:
    """Counts the SQL statements a store's engines execute."""

    def __init__(self, store):
        self.count = 0
        self._engines = {store._writer, store._reader}
        for engine in self._engines:
            event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *args) -> None:
        self.count += 1

    def close(self) -> None:
        for engine in self._engines:
            event.remove(engine, "before_cursor_execute", self._seen)


def _idle(store, first: int, last: int) -> None:
    store.add_records([Record(id=new_id("rec"), scenario=f"idle-{i:04d}", request={}, response={})
                       for i in range(first, last)])


def _boot(settings) -> dict:
    """Start a kernel with its app's hooks, count store statements and git history reads during
    start, and report what it serves and which scenarios got a growth worker."""
    reef = build_reef(settings, get_plugins())
    state = create_app(reef).state.serve
    lp = reef.learning
    history_reads = []
    history = reef.releases.artifacts.history
    reef.releases.artifacts.history = lambda scenario: history_reads.append(scenario) or history(scenario)
    stuck = CandidateRow(id=new_id("cand"), scenario="busy", recipe="basic", status="evaluating")
    reef.store.add_candidate(stuck)
    statements = _Statements(reef.store)

    async def run() -> dict:
        try:
            await reef.start()
            # read before yielding to the event loop: the workers poked at start run later
            out = {"statements": statements.count, "history_reads": len(history_reads),
                   "workers": set(lp.workers), "serving": reef.serving_release("released"),
                   "known": len(state.scenarios)}
        finally:
            statements.close()
            await reef.stop()
        return out

    out = asyncio.run(run())
    out["stuck"] = _candidate_status(settings, stuck.id)
    return out


def _candidate_status(settings, candidate_id: str) -> str:
    store = settings.open_record_store()
    try:
        return store.get_candidate(candidate_id).status
    finally:
        store.close()


def _publish_release(settings, scenario: str, tmp_path) -> Release:
    reef = Reef(settings, get_plugins())
    try:
        chain = reef.releases.chain
        artifact = tmp_path / "artifact"
        (artifact / "harness").mkdir(parents=True)
        (artifact / "harness" / "rules.md").write_text("- Be brief.\n")
        return chain.record(chain.publish(scenario, artifact, expected_head=None))
    finally:
        reef.store.close()


def test_restart_store_queries_do_not_grow_with_idle_scenarios(store_url, tmp_path):
    settings = reef_settings(tmp_path / "state", [f"record_store.url={store_url}",
                                                  "runtime.upstream_url=http://127.0.0.1:9"])
    store = settings.open_record_store()
    try:
        release = _publish_release(settings, "released", tmp_path)
        # one scenario with a pending report (worth a growth check), one whose report is consumed
        for scenario in ("busy", "done"):
            rec = Record(id=new_id("rec"), scenario=scenario, request={}, response={})
            store.add_record(rec)
            store.add_report(Report(id=new_id("rpt"), scenario=scenario, score=0.0, feedback="x",
                                    references=[rec.id], body_hash=new_id("h")))
            if scenario == "done":
                store.consume(new_id("cand"), scenario, record_ids=[rec.id],
                              report_ids=[r.id for r in store.list_reports(scenario)])
        _idle(store, 0, 10)
        few = _boot(settings)
        _idle(store, 10, 500)
        many = _boot(settings)
    finally:
        store.close()

    assert few["known"] == 1 + 3 + 10 and many["known"] == 1 + 3 + 500  # the registry sees them all
    assert many["statements"] == few["statements"]
    assert few["history_reads"] == many["history_reads"] == 0  # the chain agrees: no per-scenario git
    assert few["workers"] == many["workers"] == {"default", "busy"}
    assert few["serving"].release_id == many["serving"].release_id == release.release_id
    assert few["stuck"] == many["stuck"] == "error"


def test_a_database_ahead_of_the_artifact_store_still_stops_the_start(tmp_path):
    settings = reef_settings(tmp_path / "state", ["runtime.upstream_url=http://127.0.0.1:9"])
    store = settings.open_record_store()
    store.add_release(Release(scenario="s", sequence=1, release_id=new_id("rel"), content_hash="0" * 64,
                              operation="train", git_commit="1" * 40))
    store.close()
    reef = Reef(settings, get_plugins())

    async def run() -> None:
        try:
            await reef.start()
        finally:
            await reef.stop()

    with pytest.raises(Exception, match="artifact store does not have it"):
        asyncio.run(run())
