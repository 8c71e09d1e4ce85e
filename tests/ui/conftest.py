"""A server with real learning data for the dashboard tests: a rejected candidate, two published
ones, a rollback, scored feedback under each release, a pending report, and a second scenario."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from reef_core.testing import FakeUpstream, ReefServer, system_prompt
from tests.loop.conftest import settings_for

ADMIN = "ui-admin-token"
#: may only read scenario "default" (and report there): no admin actions, no other scenario
READER = "ui-reader-token"
GOOD_RULE = "Always name the capital city explicitly"
TASKS = [
    {"id": "capital", "prompt": "What is the capital of France?", "expected": "Paris"},
    {"id": "greeting", "prompt": "Say hi", "expected": "Hi."},
]


def model(body: dict[str, Any]) -> str:
    """Names capitals only when told to, and greets briefly only when told to be brief."""
    rules = system_prompt(body).lower()
    text = str(body.get("messages", [{}])[-1].get("content", "")).lower()
    if "capital" in text:
        return "The capital is Paris." if "name the capital city" in rules else "I am not sure."
    return "Hi." if "be brief" in rules else "Hello there, how can I help you today?"


def config() -> dict[str, Any]:
    return {
        "recipe": {"name": "feedback_rules", "batch_size": 1, "max_score": 0.5, "max_rules": 50,
                   "max_rule_chars": 240, "proposer": None},
        # one task won is enough to publish: the fixture's steps are deterministic
        "evaluator": {"name": "task_suite", "tasks": TASKS, "grader": "contains", "margin": 0,
                      "rule": "wins_minus_losses", "episode_timeout_s": 30, "timeout_s": 120, "concurrency": 2},
        # growth only on request; a rejected report is not retried
        "loop": {"enabled": False, "schedule_s": None, "max_attempts": 1},
    }


@dataclass
class LearningRun:
    server: ReefServer
    upstream: FakeUpstream
    admin: str = ADMIN
    reader: str = READER
    #: receipts, oldest first
    records: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    published: list[str] = field(default_factory=list)
    #: release ids by sequence: [train 1, train 2, rollback to 1]
    releases: list[str] = field(default_factory=list)

    def api(self, token: str | None = None) -> httpx.Client:
        return self.server.client(token=token or self.admin)


def _ask(api: httpx.Client, question: str, *, scenario: str = "default", session: str | None = None) -> str:
    headers = {"x-reef-scenario": scenario, **({"x-reef-session": session} if session else {})}
    r = api.post("/v1/chat/completions", headers=headers,
                 json={"model": "fake-model", "messages": [{"role": "user", "content": question}]})
    assert r.status_code == 200, r.text
    return r.headers["x-reef-agent-record-id"]


def _report(api: httpx.Client, receipt: str, score: float, feedback: str, scenario: str = "default") -> None:
    r = api.post("/reef/report", headers={"x-reef-scenario": scenario},
                 json={"references": [receipt], "score": score, "feedback": feedback})
    assert r.status_code == 200, r.text


def _grow(api: httpx.Client, expected: str) -> dict[str, Any]:
    r = api.post("/reef/scenarios/default/grow")
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] == expected, r.json()
    return r.json()


@contextmanager
def build_learning_run(tmp_path: Path) -> Iterator[LearningRun]:
    tokens = (f"auth.tokens=[{{token: {ADMIN}, role: admin}}, "
              f"{{token: {READER}, role: report, scenarios: [default]}}]")
    with FakeUpstream("openai", model) as up:
        settings = settings_for(tmp_path, up, config(), overrides=[tokens])
        with ReefServer(tmp_path, settings=settings, token=ADMIN) as server:
            run = LearningRun(server=server, upstream=up)
            api = run.api()
            # 1: a rule that helps no task: rejected
            run.records.append(_ask(api, "What is the capital of Italy?", session="alice"))
            _report(api, run.records[-1], 0.0, "Be polite")
            run.rejected.append(_grow(api, "rejected")["candidate_id"])
            # 2: the capital rule wins the capital task: release 1
            run.records.append(_ask(api, "What is the capital of Spain?", session="alice"))
            _report(api, run.records[-1], 0.0, GOOD_RULE)
            step = _grow(api, "published")
            run.published.append(step["candidate_id"])
            run.releases.append(step["release_id"])
            # scored feedback on what release 1 serves
            for score in (0.9, 0.7):
                run.records.append(_ask(api, "What is the capital of France?", session="bob"))
                _report(api, run.records[-1], score, "good")
            # 3: brevity wins the greeting task: release 2
            run.records.append(_ask(api, "Say hello", session="bob"))
            _report(api, run.records[-1], 0.2, "Be brief")
            step = _grow(api, "published")
            run.published.append(step["candidate_id"])
            run.releases.append(step["release_id"])
            run.records.append(_ask(api, "Say hello again", session="carol"))
            _report(api, run.records[-1], 1.0, "perfect")
            # 4: back to release 1 (published again as release 3)
            r = api.post("/reef/scenarios/default/rollback", json={"release_id": run.releases[0]})
            assert r.status_code == 200, r.text
            run.releases.append(r.json()["release"]["release_id"])
            run.records.append(_ask(api, "Say hello once more", session="carol"))
            _report(api, run.records[-1], 0.6, "fine")
            # experience waiting for the next step (the dashboard's grow)
            run.records.append(_ask(api, "Greet me", session="dave"))
            _report(api, run.records[-1], 0.1, "Be brief")
            # a second scenario the limited token must never see
            _report(api, _ask(api, "Private question", scenario="other"), 0.5, "other feedback", scenario="other")
            yield run


@pytest.fixture(scope="module")
def learning_run(tmp_path_factory) -> Iterator[LearningRun]:
    """One learning run shared by a module's read-only tests."""
    with build_learning_run(tmp_path_factory.mktemp("ui-run")) as run:
        yield run


class Browser:
    """A cookie-keeping HTTP client of the dashboard (no scripts: the pages as served)."""

    def __init__(self, url: str, token: str | None):
        self.http = httpx.Client(base_url=url, follow_redirects=False, timeout=30)
        if token is not None:
            r = self.http.post("/ui/login", data={"token": token, "next": "/ui"})
            assert r.status_code == 303, r.text

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.get(path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.post(path, **kwargs)

    def csrf(self, path: str = "/ui") -> str:
        found = re.search(r'name="csrf" value="([^"]+)"', self.get(path).text)
        assert found, "no CSRF token on the page"
        return found.group(1)
