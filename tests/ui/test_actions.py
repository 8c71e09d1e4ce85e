"""The dashboard's admin actions as htmx sends them: grow with its progress panel, the learning
mode, and the progress of a step's tasks."""

from __future__ import annotations

import time

from bs4 import BeautifulSoup

from reef_core.ui.progress import TrackedProgress

from .conftest import ADMIN, READER, Browser, build_learning_run

HX = {"hx-request": "true"}


def test_tracked_progress_keeps_each_tasks_count():
    progress = TrackedProgress("s")
    with progress.task("evaluating", total=4) as bar:
        bar.advance()
        bar.advance(2)
        assert progress.snapshot() == [{"description": "evaluating", "total": 4, "completed": 3, "done": False}]
    with progress.task("training"):
        pass
    assert [(t["description"], t["done"]) for t in progress.snapshot()] == [("evaluating", True), ("training", True)]


def test_grow_shows_progress_then_reloads_and_mode_is_set(tmp_path):
    with build_learning_run(tmp_path) as run:
        api, admin = run.api(), Browser(run.server.url, ADMIN)
        csrf = admin.csrf("/ui/scenarios/default")
        started = admin.post("/ui/scenarios/default/grow", data={"csrf": csrf}, headers=HX)
        assert started.status_code == 200
        panel = BeautifulSoup(started.text, "html.parser").select_one("#progress")
        # the step was only started: the panel polls every second until it ends
        assert "running" in panel["class"] and panel["hx-trigger"] == "every 1s"
        assert panel["hx-get"] == "/ui/scenarios/default/progress?watching=1"

        deadline = time.monotonic() + 60
        while True:
            poll = admin.get("/ui/scenarios/default/progress?watching=1", headers=HX)
            assert poll.status_code == 200
            if poll.headers.get("hx-refresh") == "true":  # ended: the page reloads
                break
            assert time.monotonic() < deadline, "the growth step never ended"
            time.sleep(0.1)
        step = api.get("/reef/scenarios/default").json()["loop"]["last_step"]
        assert step["outcome"] == "published" and step["trigger"] == "manual"
        idle = BeautifulSoup(admin.get("/ui/scenarios/default/progress", headers=HX).text, "html.parser")
        assert idle.select_one("#progress").get("hx-trigger") is None
        assert idle.select_one("[data-outcome]")["data-outcome"] == "published"

        # the learning mode: a select of the modes, stored as the API stores it
        page = BeautifulSoup(admin.get("/ui/scenarios/default").text, "html.parser")
        assert page.select_one("#mode-select option[selected]")["value"] == "auto"
        r = admin.post("/ui/scenarios/default/mode", data={"csrf": csrf, "mode": "paused"}, headers=HX)
        assert r.status_code == 200 and r.headers["hx-redirect"] == "/ui/scenarios/default"
        mode = api.get("/reef/scenarios/default/mode").json()
        assert mode["mode"] == "paused" and mode["set_by"] == "dashboard"
        page = BeautifulSoup(admin.get("/ui/scenarios/default").text, "html.parser")
        assert page.select_one("#flash").get_text() == "Learning mode of default set to paused"
        assert page.select_one("#mode-select option[selected]")["value"] == "paused"
        assert "set by dashboard" in page.select_one("#mode").get_text()
        refused = admin.post("/ui/scenarios/default/grow", data={"csrf": csrf})
        assert refused.status_code == 409 and "learning mode 'paused'" in BeautifulSoup(refused.text, "html.parser").text
        bad = admin.post("/ui/scenarios/default/mode", data={"csrf": csrf, "mode": "turbo"})
        assert bad.status_code == 422 and "expected one of auto" in bad.text

        reader = Browser(run.server.url, READER)
        denied = reader.post("/ui/scenarios/default/mode", data={"csrf": reader.csrf(), "mode": "auto"})
        assert denied.status_code == 403
        assert api.get("/reef/scenarios/default/mode").json()["mode"] == "paused"
        # an action's error lands in the panel for htmx, with the status in the page
        forged = admin.post("/ui/scenarios/default/mode", data={"csrf": "x", "mode": "auto"}, headers=HX)
        assert forged.status_code == 200 and 'data-status="403"' in forged.text
