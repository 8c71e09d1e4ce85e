"""The main command learns: a Reef composed with ``scripts/serve``'s own overrides (its runtime a
fake of the model that follows the rule once it is in the system prompt) runs the README's
"Teach it" as written — reports with feedback, a published release, the next answer carrying
it — and says at start-up what learns, from what, and what its gate still needs."""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reef_core.builtins.feedback_rules import FeedbackRulesRecipe
from reef_core.grow.explain import gate_needs, learning_line, startup_notes
from reef_core.testing import FakeUpstream, ReefServer, system_prompt
from reef_core.testing.replies import last_user_text

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
EMBEDDED = "SmolLM2-135M-Instruct"
DOC_URL = 'reef = "http://127.0.0.1:8900"'
#: the feedback the README's users write, and the rule the recipe makes of it
RULE = "Answer in one short sentence."
LONG = ("Well, that is a big question, and there are many things one could say about it, starting with "
        "its history, going on to how it works in practice, and ending with what people think of it today.")


def wait_published(client, timeout: float = 120.0) -> dict:
    """The scenario's first release, once its growth step has finished publishing it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        releases = client.get("/reef/scenarios/default/releases").json()["releases"]
        last = client.get("/reef/scenarios/default").json()["loop"]["last_step"] or {}
        if releases and last.get("release_id") == releases[0]["release_id"]:
            return releases[0]
        time.sleep(0.2)
    raise AssertionError("no release was published")


def serve_overrides() -> list[str]:
    """The Hydra overrides ``scripts/serve`` passes to ``reef serve`` (before the caller's)."""
    line = next(ln for ln in (ROOT / "scripts" / "serve").read_text().splitlines() if ln.startswith("exec "))
    argv = shlex.split(line)
    assert argv[1:3] == [".venv/bin/reef", "serve"] and argv[-1] == "$@", line
    return argv[3:-1]


def teach_blocks() -> list[str]:
    """The Python blocks of the README's "Teach it" section, in order."""
    section = README.split("\n### Teach it\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def follows_the_rule(body: dict) -> str:
    """SmolLM2 as the README's run saw it: short once the rule is in its system prompt."""
    question = last_user_text(body)
    return f"{question.rstrip('?')}: a short answer." if RULE in system_prompt(body) else LONG


def _main_command(tmp_path: Path, up: FakeUpstream) -> ReefServer:
    overrides = [o for o in serve_overrides() if o != "runtime=local"]  # the fake stands in for the model
    return ReefServer(tmp_path / "state", [*overrides, f"runtime.model={EMBEDDED}"], upstream=up)


def test_scripts_serve_learns_from_feedback_behind_the_traffic_gate():
    overrides = serve_overrides()
    assert "runtime=local" in overrides and "recipe=feedback_rules" in overrides and "evaluator=traffic" in overrides


def test_the_readme_teach_it_run_publishes_a_release_the_next_answer_carries(tmp_path):
    teach, after = teach_blocks()
    with FakeUpstream("openai", follows_the_rule, model=EMBEDDED) as up, _main_command(tmp_path, up) as reef:
        scope: dict = {}
        exec(compile(teach.replace(DOC_URL, f'reef = "{reef.url}"'), "README: Teach it", "exec"), scope)  # noqa: S102
        release = wait_published(reef.client())
        candidate = reef.client().get(f"/reef/scenarios/default/candidates/{release['candidate_id']}").json()["candidate"]
        assert candidate["evaluation"]["metrics"]["traffic_tasks"], candidate  # the gate ran on graded traffic
        assert RULE in candidate["summary"]

        env = {**os.environ, "REEF_URL": reef.url}
        shown = subprocess.run([sys.executable, "-m", "reef_core", "releases"], capture_output=True, text=True,
                               env=env, cwd=tmp_path, timeout=120)
        assert shown.returncode == 0 and release["release_id"] in shown.stdout, shown.stdout + shown.stderr

        exec(compile(after, "README: the next answer", "exec"), scope)  # noqa: S102
        assert scope["raw"].headers["x-reef-release-id"] == release["release_id"]
        assert RULE in system_prompt(up.requests[-1]) and scope["raw"].parse().choices[0].message.content != LONG


def test_start_up_says_what_learns_and_that_the_gate_has_no_tasks_of_yours(tmp_path):
    with FakeUpstream("openai", follows_the_rule, model=EMBEDDED) as up, _main_command(tmp_path, up) as reef:
        notes = startup_notes(reef.reef)
    (level, line), (gate_level, gate) = notes
    assert level == logging.INFO and line.startswith("learning on: recipe feedback_rules")
    assert "a candidate every 3 eligible report(s)" in line and "gate: task_suite" in line
    assert "recipe=NAME evaluator=NAME" in line and "reef mode default record_only" in line
    assert gate_level == logging.WARNING and "no tasks of yours" in gate and "evaluator.tasks=" in gate
    assert f"```text\n{line}\n```" in README  # the line the README shows is the one it logs


def test_start_up_says_when_nothing_is_learnt(tmp_path):
    with FakeUpstream("openai", follows_the_rule, model=EMBEDDED) as up, \
            ReefServer(tmp_path, [f"runtime.model={EMBEDDED}"], upstream=up) as reef:  # the root config: basic
        [(level, line)] = startup_notes(reef.reef)
    assert level == logging.INFO and line.startswith("learning off: recipe basic")
    assert "recipe=feedback_rules evaluator=traffic" in line


@pytest.mark.parametrize(("tasks", "traffic", "needs"), [([], 20, True), ([{"prompt": "A?", "expected": "a"}], 20, False),
                                                        ([{"prompt": "A?", "expected": "a"}], 0, False)])
def test_the_gate_needs_tasks_only_when_none_are_the_operators(tasks, traffic, needs):
    from reef_core.builtins.evaluators import TaskSuiteEvaluator

    assert (gate_needs(TaskSuiteEvaluator(tasks=tasks, traffic_tasks=traffic)) is not None) is needs


@pytest.mark.parametrize("loop_enabled", [True, False])
@pytest.mark.parametrize("mode", ["auto", "manual", "paused", "record_only"])
def test_the_line_says_whether_each_mode_learns_and_how_to_change_it(mode, loop_enabled):
    from types import SimpleNamespace

    plan = SimpleNamespace(scenario="s", recipe_name="feedback_rules", recipe=FeedbackRulesRecipe(batch_size=4),
                           evaluator_name="task_suite")
    line = learning_line(plan, mode=mode, loop_enabled=loop_enabled)
    assert "\n" not in line and "a candidate every 4 eligible report(s)" in line and "gate: task_suite" in line
    assert "textual feedback of low-scored reports" in line and "recipe=NAME evaluator=NAME" in line
    learns = loop_enabled and mode in ("auto", "manual")
    assert line.startswith("learning on") is learns
    assert ("reef mode s auto" in line) is (loop_enabled and not learns)
    assert ("reef grow" in line) is (learns and mode == "manual")


def test_the_line_says_when_a_step_takes_the_batches_that_waited():
    from types import SimpleNamespace

    recipe = FeedbackRulesRecipe(batch_size=4)
    recipe.max_batches = 3
    plan = SimpleNamespace(scenario="s", recipe_name="feedback_rules", recipe=recipe, evaluator_name="task_suite")
    assert "a candidate every 4 eligible report(s) (up to 12 at once when more wait) of scenario 's'" in \
        learning_line(plan, mode="auto", loop_enabled=True)
