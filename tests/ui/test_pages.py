"""The dashboard's pages as served (no scripts), checked against the API's numbers on a server
with a real learning run: a rejected and two published candidates and a rollback."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

import reef_core.ui
from reef_core.testing import FakeUpstream, ReefServer
from reef_core.ui import chart

from .conftest import ADMIN, GOOD_RULE, READER, Browser, LearningRun


def soup(response) -> BeautifulSoup:
    assert response.status_code == 200, response.text[:500]
    return BeautifulSoup(response.text, "html.parser")


@pytest.fixture(scope="module")
def admin(learning_run) -> Browser:
    return Browser(learning_run.server.url, ADMIN)


@pytest.fixture(scope="module")
def reader(learning_run) -> Browser:
    return Browser(learning_run.server.url, READER)


def text(response) -> str:
    return BeautifulSoup(response.text, "html.parser").get_text(" ")


def all_pages(run: LearningRun) -> list[str]:
    base = "/ui/scenarios/default"
    return ["/ui", base, f"{base}/records", *(f"/ui/records/{r}" for r in run.records[:3]),
            *(f"{base}/candidates/{c}" for c in run.rejected + run.published),
            *(f"{base}/releases/{r}" for r in run.releases)]


def test_login_exchanges_the_token_for_a_browser_session_cookie(learning_run):
    anon = Browser(learning_run.server.url, None)
    r = anon.get("/ui/scenarios/default?x=1")
    assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=%2Fui%2Fscenarios%2Fdefault%3Fx%3D1"
    assert anon.get("/ui/login").status_code == 200
    bad = anon.post("/ui/login", data={"token": "not-a-token", "next": "/ui"})
    assert bad.status_code == 401 and "matches no configured token" in bad.text
    assert "set-cookie" not in bad.headers

    r = anon.post("/ui/login", data={"token": ADMIN, "next": "https://evil.example/ui"})
    assert r.status_code == 303 and r.headers["location"] == "/ui"  # only dashboard paths
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    assert "max-age" not in cookie and "expires" not in cookie  # ends with the browser session
    assert ADMIN.lower() not in cookie
    assert anon.get("/ui").status_code == 200

    # the API does not take the cookie: it is not a token
    api = learning_run.server.client(token="", cookies=dict(anon.http.cookies))
    assert api.get("/reef/scenarios").status_code == 401

    csrf = anon.csrf()
    out = anon.post("/ui/logout", data={"csrf": csrf})
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    assert anon.get("/ui").status_code == 303


def test_no_page_shows_a_token_or_loads_from_another_site(learning_run, admin):
    for path in all_pages(learning_run):
        r = admin.get(path)
        assert r.status_code == 200, path
        assert ADMIN not in r.text and READER not in r.text, path
        page = BeautifulSoup(r.text, "html.parser")
        for tag in page.find_all(["script", "link", "img"]):
            src = tag.get("src") or tag.get("href") or ""
            assert src.startswith("/ui/static/") or src == "data:,", (path, src)
        assert "content-security-policy" in r.headers
    htmx = admin.get("/ui/static/htmx-2.0.11.min.js")
    assert htmx.status_code == 200 and "htmx" in htmx.text[:2000]


def test_scenarios_page_matches_the_api(learning_run, admin):
    api = learning_run.api()
    page = soup(admin.get("/ui"))
    rows = {tr["data-scenario"]: tr for tr in page.select("#scenarios tbody tr")}
    assert set(rows) == {"default", "other"}
    for name, tr in rows.items():
        detail = api.get(f"/reef/scenarios/{name}").json()
        cells = {td["class"][0]: td.get_text(" ", strip=True) for td in tr.find_all("td") if td.get("class")}
        assert cells["records"] == str(detail["counts"]["records"])
        assert cells["reports"] == str(detail["counts"]["reports"])
        assert cells["eligible"] == str(detail["loop"]["eligible"])
        candidates = api.get(f"/reef/scenarios/{name}/candidates").json()["candidates"]
        if candidates:
            assert cells["decision"] == candidates[0]["status"]
            assert candidates[0]["id"] in tr.select_one("td.candidate a")["href"]
        serving = detail["serving_release_id"]
        assert (serving in cells["serving"]) if serving else cells["serving"] == "–"
    assert learning_run.releases[2] in rows["default"].select_one("td.serving").get_text()
    assert rows["default"].select_one("td.eligible").get_text() == "1"


def test_chart_points_are_the_apis_numbers(learning_run, admin):
    api = learning_run.api()
    records = api.get("/reef/scenarios/default/records", params={"limit": 500}).json()["records"]
    release_of = {r["id"]: r["release_id"] or "no release" for r in records}
    scores: dict[str, list[float]] = defaultdict(list)
    seen = set()
    for record in records:
        for report in record["reports"]:
            if report["id"] in seen or report["score"] is None:
                continue
            seen.add(report["id"])
            scores[release_of[report["references"][0]]].append(report["score"])
    expected = {release: (sum(v) / len(v), len(v)) for release, v in scores.items()}

    page = soup(admin.get("/ui/scenarios/default"))
    points = {c["data-release"]: (float(c["data-mean"]), int(c["data-n"]))
              for c in page.select("#learning-curve circle.release-point")}
    assert set(points) == set(expected) == {"no release", *learning_run.releases}
    for release, (mean, n) in expected.items():
        assert points[release][0] == pytest.approx(mean) and points[release][1] == n
    # the per-window points hold every scored report
    assert sum(int(c["data-n"]) for c in page.select("#learning-curve circle.window")) == len(seen)

    chain = api.get("/reef/scenarios/default/releases").json()["releases"]
    marks = {g["data-release"]: g["data-operation"] for g in page.select("#learning-curve g.mark")}
    assert marks == {r["release_id"]: r["operation"] for r in chain}
    assert marks[learning_run.releases[2]] == "rollback"
    # the releases of this run came seconds apart: their labels are drawn stacked, none on another
    labels = [(float(t["x"]), float(t["y"]), t["text-anchor"], t.get_text())
              for t in page.select("#learning-curve g.mark text")]
    assert labels and len({(x, y) for x, y, _, _ in labels}) == len(labels)
    for i, (x, y, anchor, text) in enumerate(labels):
        left, right = chart.label_extent(x, anchor, text)
        for other_x, other_y, other_anchor, other_text in labels[i + 1:]:
            other_left, other_right = chart.label_extent(other_x, other_anchor, other_text)
            assert y != other_y or right <= other_left or other_right <= left, (text, other_text)
    for release in chain:
        ev = release["evaluation"] or {}
        shown = page.select_one(f'#learning-curve rect.eval.candidate[data-release="{release["release_id"]}"]')
        if ev.get("candidate_mean") is None:
            assert shown is None
        else:
            assert float(shown["data-candidate-mean"]) == pytest.approx(ev["candidate_mean"])
    table = {tr["data-release"]: tr.select_one("td.n").get_text() for tr in page.select("#curve-table tbody tr")}
    assert table == {release: str(n) for release, (_, n) in expected.items()}


@pytest.mark.parametrize("which", ["rejected", "published"])
def test_candidate_page_evaluation_table_matches_the_candidate(learning_run, admin, which):
    candidate_id = getattr(learning_run, which)[0]
    api = learning_run.api()
    got = api.get(f"/reef/scenarios/default/candidates/{candidate_id}", params={"limit": 1000}).json()
    candidate = got["candidate"]
    evaluation = candidate["evaluation"]
    per_task: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"c": [], "s": []})
    for task, c, s in zip(evaluation["tasks"], evaluation["candidate_scores"], evaluation["current_scores"]):
        per_task[task]["c"].append(c)
        per_task[task]["s"].append(s)

    page = soup(admin.get(f"/ui/scenarios/default/candidates/{candidate_id}"))
    rows = {tr["data-task"]: tr for tr in page.select("#evaluation tbody tr")}
    assert set(rows) == set(per_task)
    outcomes = defaultdict(int)
    for task, tr in rows.items():
        cand = sum(per_task[task]["c"]) / len(per_task[task]["c"])
        serving = sum(per_task[task]["s"]) / len(per_task[task]["s"])
        assert float(tr.select_one("td.candidate")["data-value"]) == pytest.approx(cand)
        assert float(tr.select_one("td.current")["data-value"]) == pytest.approx(serving)
        crashed = [sum(1 for e in got["episodes"] if e["task_id"] == task and e["side"] == side and e["error"])
                   for side in ("candidate", "current")]
        assert tr.select_one("td.crashed").get_text(strip=True) == f"{crashed[0]} / {crashed[1]}"
        outcomes[tr["data-outcome"]] += 1
    metrics = evaluation["metrics"]
    totals = page.select_one("#evaluation-totals")
    assert (int(totals["data-wins"]), int(totals["data-losses"]), int(totals["data-ties"])) == \
        (metrics["wins"], metrics["losses"], metrics["ties"])
    assert (outcomes["win"], outcomes["loss"], outcomes["tie"]) == (metrics["wins"], metrics["losses"], metrics["ties"])
    assert page.select_one("#status").get_text() == candidate["status"] == which
    rules = [li.get_text() for li in page.select("#rules-added li")]
    assert rules == candidate["artifact"]["metadata"]["added_rules"]


def test_release_page_shows_the_added_rule_and_the_manifest(learning_run, admin):
    api = learning_run.api()
    first = learning_run.releases[0]
    detail = api.get(f"/reef/scenarios/default/releases/{first}").json()
    page = soup(admin.get(f"/ui/scenarios/default/releases/{first}"))
    added = [s.get_text() for s in page.select("#diff span.add")]
    assert f"+- {GOOD_RULE}." in added
    assert f"+- {GOOD_RULE}." in detail["diff"]
    assert detail["manifest"]["content_hash"] in page.select_one("#manifest").get_text()
    files = [tr.find("code").get_text() for tr in page.select("#files tbody tr")]
    assert files == sorted(detail["manifest"]["files"])

    rollback = soup(admin.get(f"/ui/scenarios/default/releases/{learning_run.releases[2]}"))
    assert rollback.select_one("#operation").get_text() == "rollback"
    # back to release 1's content: the diff against release 2 removes the brevity rule
    assert "-- Be brief." in [s.get_text() for s in rollback.select("#diff span.del")]


def test_records_page_filters_and_record_page(learning_run, admin):
    api = learning_run.api()
    page = soup(admin.get("/ui/scenarios/default/records", params={"session": "bob"}))
    shown = [tr["data-record"] for tr in page.select("#records tbody tr")]
    expected = [r["id"] for r in api.get("/reef/scenarios/default/records", params={"session": "bob"}).json()["records"]]
    assert shown == expected and len(shown) == 3

    high = soup(admin.get("/ui/scenarios/default/records", params={"min_score": "0.8"}))
    scored = {tr["data-record"] for tr in high.select("#records tbody tr")}
    everything = api.get("/reef/scenarios/default/records", params={"limit": 500}).json()["records"]
    assert scored == {r["id"] for r in everything if any((x["score"] or 0) >= 0.8 for x in r["reports"])}
    assert len(scored) == 2
    assert soup(admin.get("/ui/scenarios/default/records", params={"status": "error"})).select("#records") == []
    bad = admin.get("/ui/scenarios/default/records", params={"min_score": "lots"})
    assert bad.status_code == 422 and "min_score" in bad.text and "Traceback" not in bad.text

    receipt = learning_run.records[2]  # served by release 1, scored 0.9
    record = api.get(f"/reef/records/{receipt}").json()
    page = soup(admin.get(f"/ui/records/{receipt}"))
    assert page.select_one("#answer").get_text() == record["response"]["choices"][0]["message"]["content"]
    assert record["release_id"] in page.select_one("#release").get_text()
    usage = record["usage"]
    assert page.select_one("#tokens").get_text() == (f"prompt {usage['input_tokens']} · completion "
                                                      f"{usage['output_tokens']} · total {usage['total_tokens']}")
    assert [tr["data-report"] for tr in page.select("#reports tbody tr")] == [x["id"] for x in record["reports"]]
    assert page.select_one("#reports td.score").get_text() == "0.9"
    assert GOOD_RULE in page.select_one("#request").get_text()  # the harness as sent upstream


def test_a_scenario_limited_token_sees_only_its_scenario_and_no_admin_action(learning_run, reader):
    page = soup(reader.get("/ui"))
    assert [tr["data-scenario"] for tr in page.select("#scenarios tbody tr")] == ["default"]
    scenario = soup(reader.get("/ui/scenarios/default"))
    assert scenario.select("#admin-actions") == [] and scenario.select("button.rollback") == []
    assert scenario.select("#grow") == []
    other = reader.get("/ui/scenarios/other")
    assert other.status_code == 403 and "not allowed to use scenario 'other'" in text(other)
    other_records = learning_run.api().get("/reef/scenarios/other/records").json()["records"]
    assert reader.get(f"/ui/records/{other_records[0]['id']}").status_code == 404
    assert reader.get("/ui/scenarios/other/records").status_code == 403

    csrf = reader.csrf("/ui/scenarios/default")
    heads = learning_run.api().get("/reef/scenarios/default/releases").json()["releases"]
    grow = reader.post("/ui/scenarios/default/grow", data={"csrf": csrf})
    assert grow.status_code == 403 and "needs 'admin'" in text(grow)
    back = reader.post("/ui/scenarios/default/rollback", data={"csrf": csrf, "release_id": learning_run.releases[1]})
    assert back.status_code == 403
    assert learning_run.api().get("/reef/scenarios/default/releases").json()["releases"] == heads


def test_admin_actions_need_the_forms_csrf_token(learning_run, admin):
    heads = learning_run.api().get("/reef/scenarios/default/releases").json()["releases"]
    for data in ({}, {"csrf": "forged"}):
        r = admin.post("/ui/scenarios/default/rollback", data={**data, "release_id": learning_run.releases[1]})
        assert r.status_code == 403 and "security token" in r.text
        assert admin.post("/ui/scenarios/default/grow", data=data).status_code == 403
    assert learning_run.api().get("/reef/scenarios/default/releases").json()["releases"] == heads
    missing = admin.post("/ui/scenarios/default/rollback", data={"csrf": admin.csrf()})
    assert missing.status_code == 422 and "release_id" in missing.text


def test_unknown_things_are_error_pages(admin):
    for path, status in [("/ui/scenarios/nope", 404), ("/ui/scenarios/default/candidates/cand_nope", 404),
                         ("/ui/scenarios/default/releases/rel_nope", 404), ("/ui/records/rec_nope", 404)]:
        r = admin.get(path)
        assert r.status_code == status, path
        assert r.headers["content-type"].startswith("text/html") and "Traceback" not in r.text


def test_with_auth_off_there_is_no_login(tmp_path):
    with FakeUpstream("openai") as up, ReefServer(tmp_path, upstream=up) as server:
        browser = Browser(server.url, None)
        r = browser.get("/ui")
        assert r.status_code == 200 and "auth off" in r.text
        assert "httponly" in r.headers["set-cookie"].lower()  # a session only for the CSRF token
        assert browser.get("/ui/login").status_code == 303
        page = soup(browser.get("/ui/scenarios/default"))
        assert page.select("#admin-actions")  # the anonymous user is admin


def test_scenarios_come_a_page_at_a_time(admin, monkeypatch):
    from reef_core.ui import pages

    monkeypatch.setattr(pages, "SCENARIOS_PER_PAGE", 1)
    first = soup(admin.get("/ui"))
    assert [tr["data-scenario"] for tr in first.select("#scenarios tbody tr")] == ["default"]
    second = soup(admin.get(first.select_one("#more-scenarios")["href"]))
    assert [tr["data-scenario"] for tr in second.select("#scenarios tbody tr")] == ["other"]
    assert second.select("#more-scenarios") == []
    bad = admin.get("/ui", params={"cursor": "not-a-cursor!"})
    assert bad.status_code == 400 and "cursor" in text(bad)


def test_a_server_without_a_learning_loop_has_no_actions(tmp_path):
    with FakeUpstream("openai") as up, ReefServer(tmp_path, upstream=up, learning=False) as server:
        browser = Browser(server.url, None)
        page = soup(browser.get("/ui/scenarios/default"))
        assert page.select("#admin-actions") == [] and "not running on this server" in page.get_text()
        assert soup(browser.get("/ui")).select('#scenarios tr[data-scenario="default"]')
        assert browser.post("/ui/scenarios/default/grow", data={"csrf": "forged"}).status_code == 403


def test_an_undecided_candidate_shows_as_its_own_status(tmp_path):
    from tests.loop.conftest import UndecidedEvaluator, add_plugin, feedback_rules_config, report, settings_for

    add_plugin("evaluator", "undecided", UndecidedEvaluator)
    config = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={"name": "undecided"})
    with FakeUpstream("openai") as up, ReefServer(tmp_path, settings=settings_for(tmp_path, up, config)) as server:
        api = server.client()
        r = api.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
        report(api, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback=GOOD_RULE)
        cid = api.post("/reef/scenarios/default/grow").json()["candidate_id"]
        browser = Browser(server.url, None)
        row = soup(browser.get("/ui/scenarios/default")).select_one(f'#candidates tr[data-candidate="{cid}"]')
        assert row["data-status"] == "undecided" and row.select_one("span.status.undecided").get_text() == "undecided"
        assert "the cap (max_episodes) is reached; undecided" in row.select_one("td.reason").get_text()
        page = soup(browser.get(f"/ui/scenarios/default/candidates/{cid}"))
        assert page.select_one("#status").get_text() == "undecided" and "(decision: undecided)" in page.get_text()
    css = (Path(reef_core.ui.__file__).parent / "static" / "reef-ui.css").read_text()
    assert ".status.undecided" in css  # told apart from published and rejected at a glance


def test_a_scenario_page_lists_the_newest_releases_and_says_how_many_more(learning_run, admin, monkeypatch):
    from reef_core.ui import pages

    monkeypatch.setattr(pages, "PAGE_RELEASES", 1)
    page = soup(admin.get("/ui/scenarios/default"))
    newest = learning_run.api().get("/reef/scenarios/default/releases").json()["releases"][0]["release_id"]
    assert [tr["data-release"] for tr in page.select("#releases tbody tr")] == [newest]
    assert page.select_one("#older-releases").get_text().startswith("2 older releases not shown")


def test_dashboard_errors_are_pages_and_a_fragments_login_returns_to_its_page(learning_run, admin):
    csrf = admin.csrf("/ui/scenarios/default")
    broken = admin.post("/ui/scenarios/default/rollback", content=b"x",
                        headers={"content-type": "multipart/form-data"})  # no boundary
    assert broken.status_code == 400 and broken.headers["content-type"].startswith("text/html")
    unknown = admin.post("/ui/scenarios/no-such/grow", data={"csrf": csrf})
    assert unknown.status_code == 404 and "no scenario named 'no-such'" in text(unknown)
    assert learning_run.api().post("/reef/scenarios/no-such/grow").status_code == 404

    anon = Browser(learning_run.server.url, None)
    page = f"{learning_run.server.url}/ui/scenarios/default?x=1"
    poll = anon.get("/ui/scenarios/default/progress?watching=1", headers={"hx-request": "true", "hx-current-url": page})
    assert poll.headers["hx-redirect"] == "/ui/login?next=%2Fui%2Fscenarios%2Fdefault%3Fx%3D1"
    elsewhere = anon.get("/ui/scenarios/default/progress", headers={"hx-request": "true",
                                                                   "hx-current-url": "https://evil.example/ui/x"})
    assert elsewhere.headers["hx-redirect"] == "/ui/login?next=%2Fui"


def test_a_record_page_says_how_many_reports_it_leaves_out_and_the_score_filter_sees_them(tmp_path, monkeypatch):
    from reef_core.ui import pages

    monkeypatch.setattr(pages, "PAGE_REPORT_BYTES", 1)  # one report a record
    with FakeUpstream("openai") as up, ReefServer(tmp_path, upstream=up) as server:
        api = server.client()
        receipt = api.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                           ).headers["x-reef-agent-record-id"]
        for score in (0.1, 0.2, 0.33):
            assert api.post("/reef/report", json={"references": [receipt], "score": score}).status_code == 200
        browser = Browser(server.url, None)
        page = soup(browser.get(f"/ui/records/{receipt}"))
        assert len(page.select("#reports tbody tr")) == 1
        assert page.select_one("#reports-omitted").get_text().startswith("2 more reports quote it")
        found = soup(browser.get("/ui/scenarios/default/records", params={"min_score": "0.32", "max_score": "0.34"}))
        assert [tr["data-record"] for tr in found.select("#records tbody tr")] == [receipt]
        none = soup(browser.get("/ui/scenarios/default/records", params={"min_score": "0.5"}))
        assert none.select("#records tbody tr") == []
