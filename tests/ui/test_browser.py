"""The dashboard in headless Chromium (Debian's ``chromium``, driven by Playwright's Python API):
every page of a server with a real learning run, grow, roll back and the learning mode clicked
as admin, and a scenario-limited token. Screenshots go to ``$REEF_TEST_ARTIFACTS/ui`` (a
temporary directory when unset).

Needs ``scripts/setup.sh --with-browser`` (``scripts/test`` passes it); skips, saying so, only
when chromium or Playwright is absent.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import GOOD_RULE, LearningRun, build_learning_run

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed "
                                                              "(scripts/setup.sh --with-browser)")
CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                                         "(scripts/setup.sh --with-browser)")


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    with sync_api.sync_playwright() as p:
        # --no-sandbox: the tests may run as root in a container, where Chromium's sandbox cannot start
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def artifacts(tmp_path_factory) -> Path:
    root = Path(os.environ["REEF_TEST_ARTIFACTS"]) if os.environ.get("REEF_TEST_ARTIFACTS") \
        else tmp_path_factory.mktemp("artifacts")
    out = root / "ui"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def fresh_run(tmp_path) -> Iterator[LearningRun]:
    """A run of its own: these tests change it (grow, roll back)."""
    with build_learning_run(tmp_path) as run:
        yield run


def _page(chromium, run: LearningRun, token: str):
    page = chromium.new_page(viewport={"width": 1200, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("dialog", lambda d: d.accept())  # the actions' confirmations
    page.goto(f"{run.server.url}/ui")
    assert page.url.startswith(f"{run.server.url}/ui/login")
    page.fill("input[name=token]", token)
    page.click("form.login button[type=submit]")
    page.wait_for_url(f"{run.server.url}/ui")
    page.problems = problems
    return page


def test_every_page_then_grow_and_roll_back_as_admin(chromium, fresh_run, artifacts):
    run, api = fresh_run, fresh_run.api()
    page = _page(chromium, run, run.admin)
    base = f"{run.server.url}/ui/scenarios/default"
    assert page.locator("#scenarios tbody tr").count() == 2
    page.screenshot(path=str(artifacts / "scenarios.png"), full_page=True)

    # every page loads, with no script error, and shows what the API says
    page.goto(base)
    chain = api.get("/reef/scenarios/default/releases").json()["releases"]
    assert page.locator("#learning-curve g.mark").count() == len(chain) == 3
    points = page.locator("#learning-curve circle.release-point")
    assert points.count() == 4  # before any release, and releases 1, 2 and 3
    page.screenshot(path=str(artifacts / "ui-scenario.png"), full_page=True)
    page.goto(f"{base}/candidates/{run.published[0]}")
    assert page.locator("#evaluation-totals").get_attribute("data-wins") == "1"
    assert page.locator("#rules-added li").all_inner_texts() == [f"{GOOD_RULE}."]
    page.screenshot(path=str(artifacts / "ui-candidate.png"), full_page=True)
    page.goto(f"{base}/candidates/{run.rejected[0]}")
    assert page.locator("#status").inner_text() == "rejected"
    page.goto(f"{base}/releases/{run.releases[0]}")
    assert f"+- {GOOD_RULE}." in page.locator("#diff .add").all_inner_texts()
    page.screenshot(path=str(artifacts / "release.png"), full_page=True)
    page.goto(f"{base}/records")
    page.fill("input[name=session]", "bob")
    page.click("form.filters button[type=submit]")
    assert page.locator("#records tbody tr").count() == 3
    page.locator("#records tbody tr a").first.click()
    assert page.locator("#reports tbody tr").count() == 1
    page.screenshot(path=str(artifacts / "record.png"), full_page=True)

    # grow: the pending brevity report becomes release 4; the page follows the step and reloads
    page.goto(base)
    page.click("#grow")
    sync_api.expect(page.locator("#releases tbody tr")).to_have_count(4, timeout=30_000)
    step = api.get("/reef/scenarios/default").json()["loop"]["last_step"]
    assert step["outcome"] == "published" and step["trigger"] == "manual"
    assert page.locator("#last-step [data-outcome]").get_attribute("data-outcome") == "published"
    assert page.locator("#serving code").inner_text() == step["release_id"]

    # roll back to release 1: published again as release 5
    page.click(f'#releases tr[data-release="{run.releases[0]}"] button.rollback')
    sync_api.expect(page.locator("#releases tbody tr")).to_have_count(5, timeout=30_000)
    after = api.get("/reef/scenarios/default/releases").json()
    assert after["releases"][0]["operation"] == "rollback"
    assert after["releases"][0]["content_hash"] == next(r["content_hash"] for r in chain
                                                        if r["release_id"] == run.releases[0])
    assert page.locator("#serving code").inner_text() == after["serving_release_id"]
    assert page.locator("#flash").count() == 1

    # the learning mode
    page.select_option("#mode-select", "manual")
    page.click("#set-mode")
    sync_api.expect(page.locator("#flash")).to_have_text("Learning mode of default set to manual")
    assert api.get("/reef/scenarios/default/mode").json()["mode"] == "manual"
    page.screenshot(path=str(artifacts / "after-actions.png"), full_page=True)
    assert page.problems == []


def test_a_scenario_limited_token_sees_its_scenario_only(chromium, fresh_run, artifacts):
    page = _page(chromium, fresh_run, fresh_run.reader)
    assert page.locator("#scenarios tbody tr").evaluate_all("rows => rows.map(r => r.dataset.scenario)") == ["default"]
    page.goto(f"{fresh_run.server.url}/ui/scenarios/default")
    assert page.locator("#learning-curve").count() == 1
    assert page.locator("#admin-actions, #grow, button.rollback").count() == 0
    page.screenshot(path=str(artifacts / "limited.png"), full_page=True)
    assert page.problems == []
    response = page.goto(f"{fresh_run.server.url}/ui/scenarios/other")
    assert response.status == 403 and "not allowed to use scenario 'other'" in page.locator(".error").inner_text()
