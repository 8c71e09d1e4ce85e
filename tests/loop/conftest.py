"""Shared pieces of the learning-loop tests: a model whose answers depend on its system
prompt, config files, a way to wait for background work, and test-only plugins."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from reef_core.config import load_settings
from reef_core.plugins import Registered, get_plugins
from reef_core.testing import system_prompt

#: the rule that makes the fake model answer correctly, as a user would phrase the feedback
GOOD_FEEDBACK = "Always name the capital city explicitly"
TASKS = [
    {"id": "france", "prompt": "What is the capital of France?", "expected": "Paris"},
    {"id": "japan", "prompt": "What is the capital of Japan?", "expected": "Tokyo"},
]
_CAPITALS = {"france": "Paris", "japan": "Tokyo", "italy": "Rome"}


def capital_model(body: dict[str, Any]) -> str:
    """Answers a capital question correctly only when its system prompt says to name capitals."""
    if "name the capital city" not in system_prompt(body).lower():
        return "I am not sure."
    text = str(body.get("messages", [{}])[-1].get("content", "")).lower()
    for country, capital in _CAPITALS.items():
        if country in text:
            return f"The capital is {capital}."
    return "The capital is unknown."


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def settings_for(tmp_path: Path, upstream: Any, config: dict[str, Any] | None = None,
                 overrides: list[str] = ()) -> Any:
    """Validated settings: state under ``tmp_path/state``, runtime at ``upstream``, ``config``
    merged as a config file."""
    ov = [f"server.state_dir={tmp_path / 'state'}", f"runtime.upstream_url={upstream.url}",
          f"runtime.dialect={upstream.dialect}", *overrides]
    cfg_file = write_config(tmp_path / "reef-test.yaml", config) if config else None
    return load_settings(ov, get_plugins(), config_file=cfg_file)


def feedback_rules_config(*, evaluator: dict[str, Any] | None = None, batch_size: int = 2,
                          loop_enabled: bool = True, scenarios: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "recipe": {"name": "feedback_rules", "batch_size": batch_size, "max_score": 0.5, "max_rules": 50,
                   "max_rule_chars": 240, "proposer": None},
        "evaluator": evaluator or {"name": "task_suite", "tasks": TASKS, "grader": "contains", "margin": 0,
                                   "episode_timeout_s": 30, "timeout_s": 120, "concurrency": 2},
        "loop": {"enabled": loop_enabled, "schedule_s": None},
        "scenarios": scenarios or {},
    }


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll ``predicate`` until it returns something truthy (fails the test after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def add_plugin(kind: str, name: str, obj: Any) -> None:
    """Register a test-only plugin object in the process's (per-test) plugin registry."""
    get_plugins().registry[kind][name] = Registered(kind, name, obj, "tests.loop")


def ask(client: Any, question: str, *, scenario: str | None = None, session: str | None = None):
    headers = {}
    if scenario:
        headers["x-reef-scenario"] = scenario
    if session:
        headers["x-reef-session"] = session
    r = client.post("/v1/chat/completions", headers=headers,
                    json={"model": "fake-model", "messages": [{"role": "user", "content": question}]})
    assert r.status_code == 200, r.text
    return r


def report(client: Any, receipts: list[str], *, score: float | None, feedback: Any = None,
           scenario: str | None = None) -> dict[str, Any]:
    headers = {"x-reef-scenario": scenario} if scenario else {}
    body: dict[str, Any] = {"references": receipts}
    if score is not None:
        body["score"] = score
    if feedback is not None:
        body["feedback"] = feedback
    r = client.post("/reef/report", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def wait_published(client: Any, count: int, scenario: str = "default") -> list[dict[str, Any]]:
    """Wait until the scenario has ``count`` releases and the growth step that published the
    newest has finished (its candidate is marked published by then); return the releases."""

    def done() -> list[dict[str, Any]] | None:
        releases = client.get(f"/reef/scenarios/{scenario}/releases").json()["releases"]
        if len(releases) != count:
            return None
        last = client.get(f"/reef/scenarios/{scenario}").json()["loop"]["last_step"] or {}
        return releases if last.get("release_id") == releases[0]["release_id"] else None

    return wait_for(done, f"release {count} of {scenario}")


def grow_steps(reef: Any, times: int = 1, scenario: str = "default") -> list:
    """Start a one-shot kernel (``build_reef(..., background=False)``), run ``times`` growth
    steps of ``scenario`` one after another, stop it; the steps' results."""
    async def run():
        await reef.start()
        try:
            return [await reef.learning.grow(scenario) for _ in range(times)]
        finally:
            await reef.stop()

    return asyncio.run(run())


class UndecidedEvaluator:
    """A scripted gate whose evidence never decides: every candidate is ``undecided``."""

    def evaluate(self, candidate, current, ctx):
        from reef_core.types import Evaluation

        return Evaluation(evaluator="undecided", candidate_scores=[1.0, 0.0], current_scores=[0.0, 1.0],
                          tasks=["a", "b"], metrics={"wins": 1, "losses": 1, "ties": 0, "rounds": 4, "max_rounds": 4,
                                   "detectable_effect": 0.3})

    def decide(self, evaluation):
        from reef_core.types import Decision

        return Decision("undecided", "the interval still holds margin 0 and the cap (max_episodes) is reached; "
                                     "undecided")
