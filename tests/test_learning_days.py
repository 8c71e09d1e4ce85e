"""The overnight learning bench (bench/learning_days.py): its pure pieces, and one short run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import learning_days as days  # noqa: E402
from learning_tasks import Task  # noqa: E402


def test_the_plan_gives_both_sides_distinct_tasks_per_day():
    bench = days.DAY_RECIPES["skillclaw"]
    plan = bench.plan(0, days=3, per_day=5)
    assert [len(d) for d in plan] == [5, 5, 5]
    ids = [t.id for d in plan for t in d]
    assert len(set(ids)) == 15  # no task twice while the family lasts
    assert plan == bench.plan(0, days=3, per_day=5) and plan != bench.plan(1, days=3, per_day=5)


def test_reports_grade_give_feedback_and_leave_some_unscored():
    task = Task(id="add-3-4", prompt="What is 3 + 4?", expected="7", key="3+4")
    assert days.report_for(task, "The answer is 7", 0, 4) == (1.0, 1.0, None)
    score, reported, feedback = days.report_for(task, "3 + 4 = 8", 1, 4)
    assert (score, reported) == (0.0, 0.0) and "is 7" in feedback and "number only" in feedback
    assert days.report_for(task, "7", 3, 4) == (1.0, -1.0, None)  # graded for the bench, unscored for the recipe
    assert days.report_for(task, "7", 3, 0)[1] == 1.0


def test_the_two_sd_criterion_is_one_sided():
    met, threshold = days.criterion(0.60, [0.40, 0.50, 0.45])
    assert threshold == pytest.approx(0.45 + 2 * 0.05) and met
    assert not days.criterion(0.55, [0.40, 0.50, 0.45])[0]
    assert not days.criterion(0.30, [0.40, 0.40])[0] and days.criterion(0.41, [0.40, 0.40])[0]


def test_the_scripted_evolver_answers_in_the_recipe_format():
    from reef_recipe_skillclaw.evolver import parse_json
    from reef_recipe_skillclaw.night import load_prompts, normalise
    from reef_recipe_skillclaw.pool import Skill, SkillPool

    prompts = load_prompts()
    evolver = days.ScriptedEvolver()
    create = parse_json(evolver.answer(prompts["create"].safe_substitute(pool="(none)", count=1, sessions="x")))
    made = normalise("", create, SkillPool(), ["r0"])
    assert made.action == "create_skill" and made.name == days.SKILL_NAME
    assert made.description == days.SKILL_DESCRIPTION
    judged = parse_json(evolver.answer(prompts["judge"].safe_substitute(summary="s", digest="d")))
    assert set(judged) >= {"task_completion", "response_quality", "efficiency", "tool_usage"}

    pool = SkillPool()
    pool.put(Skill(days.SKILL_NAME, "add numbers", "Add."))
    stale = prompts["decide"].safe_substitute(name=days.SKILL_NAME, description="add numbers", body="Add.",
                                              count=1, sessions="x")
    assert normalise(days.SKILL_NAME, parse_json(evolver.answer(stale)), pool, []).action == "optimize_description"
    right = prompts["decide"].safe_substitute(name=days.SKILL_NAME, description=days.SKILL_DESCRIPTION, body="Add.",
                                              count=1, sessions="x")
    assert parse_json(evolver.answer(right))["action"] == "skip"
    merged = parse_json(evolver.answer(prompts["merge"].safe_substitute(name="sums")))
    assert merged["description"] == days.SKILL_DESCRIPTION
    assert evolver.calls == {"create": 1, "judge": 1, "decide": 2, "merge": 1}


def test_the_scripted_evolver_is_an_openai_compatible_endpoint():
    import httpx

    with days.ScriptedEvolver() as evolver:
        r = httpx.post(f"{evolver.url}/chat/completions", json={
            "model": "scripted-evolver", "messages": [{"role": "user", "content": "You review the work of an agent"}]})
    assert r.status_code == 200 and "sum" in r.json()["choices"][0]["message"]["content"]


def test_evolver_options_never_hold_a_key():
    assert days.evolver_option("model") == "runtime"
    assert days.evolver_option("scripted", "http://h/v1") == {"url": "http://h/v1", "model": "scripted-evolver"}
    endpoint = days.evolver_option("endpoint", "https://api/v1", "big")
    assert endpoint["api_key"] == "${oc.env:REEF_EVOLVER_API_KEY,none}"


def test_the_table_and_summary_line():
    results = [days.DaysSeed(0, [0.3, 0.6, 0.7], [0.3, 0.35, 0.32], 2, ["sums"], True, 60.0),
               days.DaysSeed(1, [0.3, 0.3, 0.3], [0.3, 0.35, 0.32], 0, [], True, 60.0)]
    table = days.days_table(results)
    assert "yes" in table and "sums" in table
    line = days.days_summary("skillclaw", "scripted evolver", results, 3, 8, 2.0)
    assert line.startswith("skillclaw (scripted evolver): learner final day 0.500±0.283 vs control mean day")
    assert "1/2 seeds beat control mean + 2 sd, 2 night(s) published, 2.0 min" in line
    assert json.dumps(line)


@pytest.mark.slow
def test_a_short_run_completes_and_prints_the_summary_line():
    pytest.importorskip("reef_torch")
    script = ("import sys; sys.path.insert(0, 'bench'); import learning_days; "
              "sys.exit(learning_days.main(['skillclaw', '--seeds', '1', '--days', '2', '--tasks-per-day', '4', "
              "'--evolver', 'scripted']))")
    result = subprocess.run([sys.executable, "-c", script], cwd=BENCH.parent, capture_output=True, text=True,
                            timeout=900, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("skillclaw (scripted evolver): learner final day "), last
    assert "over 2 days of 4 tasks" in last
