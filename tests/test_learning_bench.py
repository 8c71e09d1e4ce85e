"""bench/learning.py: its pieces that need no model, and one end-to-end run on real servers (slow)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from reef_core.testing import FakeUpstream, last_user_text, system_prompt

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from learning_tasks import (  # noqa: E402
    FIRST_INTEGER,
    LAST_INTEGER,
    NUMBER_ONLY,
    RECIPES,
    Task,
    addition_problems,
    first_integer,
    mean_sd,
    split_tasks,
    summary_line,
)

SUMMARY = re.compile(r"^(\w+): learner (\d+\.\d{3})±(\d+\.\d{3}) vs control (\d+\.\d{3})±(\d+\.\d{3}) "
                     r"on (\d+) held-out tasks, (\d+)/(\d+) seeds above control, (\d+\.\d) min$")


def _task(expected: int) -> Task:
    return Task(id="t", prompt="What is ?", expected=str(expected), key="k")


@pytest.mark.parametrize("name", sorted(RECIPES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_train_gate_and_heldout_are_disjoint_problems(name, seed):
    bench = RECIPES[name]
    split = bench.split(seed)
    train = {t.key for t in split.train}
    gate = {t.key for t in split.gate}
    held = {t.key for t in split.heldout}
    assert not train & gate and not train & held and not gate & held
    # disjoint as strings too: what the gate's contamination check compares
    assert not {t.prompt for t in split.train} & {t.prompt for t in split.gate + split.heldout}
    assert len(split.train) == bench.budget
    assert len(split.gate) == len(gate) == bench.gate_tasks
    assert len(split.heldout) == len(held) == bench.heldout_tasks


def test_a_split_is_the_same_for_a_seed_and_differs_across_seeds():
    bench = RECIPES["sao"]
    assert bench.split(0) == bench.split(0)
    assert bench.split(0).heldout != bench.split(1).heldout


def test_grouped_rollouts_ask_each_training_question_that_many_times_in_a_row():
    bench = RECIPES["sao"]
    assert bench.recipe_config("grpo_dis")["n_samples_per_prompt"] == 4
    train = bench.split(0, 16, "grpo_dis").train
    groups = [train[i:i + 4] for i in range(0, 16, 4)]
    assert all(len({t.id for t in g}) == 1 for g in groups)
    assert len({g[0].id for g in groups}) == 4
    assert len({t.id for t in bench.split(0, 16).train}) == 16


def test_the_seed_reaches_recipes_that_take_one():
    assert RECIPES["sao"].recipe_config(None, 2)["seed"] == 2
    assert "seed" not in RECIPES["feedback_rules"].recipe_config(None, 2)


def test_a_split_with_too_few_problems_says_so():
    with pytest.raises(ValueError, match="cannot fill"):
        split_tasks(addition_problems(1, 2, "")(), 0, train=4, gate=2, heldout=2)


def test_addition_problems_ask_and_answer_the_sum():
    tasks = addition_problems(10, 99, "Answer with the number only.")()
    assert len(tasks) == 90 * 90
    t = next(t for t in tasks if t.id == "add-23-58")
    assert t.prompt == "What is 23 + 58? Answer with the number only." and t.expected == "81"
    assert t.key == next(u for u in tasks if u.id == "add-58-23").key


@pytest.mark.parametrize("answer, first", [("81", 81), ("The answer is 81.", 81), ("23 + 58 = 81", 23),
                                           ("-5 apples", -5), ("well - 81", 81), ("none", None), (None, None)])
def test_first_integer(answer, first):
    assert first_integer(answer) == first


ANSWERS = ["81", " 81.\n", "81!", "It is 81.", "23 + 58 = 81", "810", "181", "-81", "well - 81", "8 1", "", "eighty-one",
           "81 and 23", "Answer: 81"]


@pytest.mark.parametrize("grader", [FIRST_INTEGER, LAST_INTEGER, NUMBER_ONLY], ids=lambda g: g.name)
def test_the_gate_regex_grades_like_the_user(grader):
    """The server's gate grades with the grader's regex (``re.search``, DOTALL); the simulated user
    with the Python function: they must agree on every answer."""
    task = _task(81)
    for answer in ANSWERS:
        gate = float(re.search(grader.pattern(task), answer, re.DOTALL) is not None)
        assert gate == grader(answer, task), answer


def test_graders_grade_exactly():
    task = _task(81)
    assert [FIRST_INTEGER(a, task) for a in ("81", "It is 81.", "23 + 58 = 81", "810", "-81", None)] == [1, 1, 0, 0, 0, 0]
    assert [LAST_INTEGER(a, task) for a in ("81", "23 + 58 = 81.", "81 + 1", "810", "-81", None)] == [1, 1, 0, 0, 0, 0]
    assert [NUMBER_ONLY(a, task) for a in ("81", " 81. ", "It is 81.", "81 apples", None)] == [1, 1, 0, 0, 0]


def test_mean_sd():
    assert mean_sd([0.5]) == (0.5, 0.0)
    mean, sd = mean_sd([0.2, 0.4, 0.6])
    assert mean == pytest.approx(0.4) and sd == pytest.approx(0.2)  # sample standard deviation


def test_summary_line_format():
    line = summary_line("sao", [0.5, 0.75, 0.25], [0.375, 0.75, 0.125], 64, 17.26)
    assert line == "sao: learner 0.500±0.250 vs control 0.417±0.315 on 64 held-out tasks, 2/3 seeds above control, 17.3 min"
    assert SUMMARY.match(line)


def test_the_lineage_snapshot_reads_the_servers_lineage_answer(tmp_path):
    from lineage_probe import LineageSnapshot

    assert LineageSnapshot.from_response({"scenario": "bench", "head": None}) is None
    snap = LineageSnapshot.from_response({"head": {"step": 7, "steps_since_publish": 3, "checkpoint": str(tmp_path),
                                                    "last_reset": {"step": 5, "reason": "worse"}}})
    assert (snap.step, snap.steps_since_publish, snap.checkpoint, snap.last_reset) == (7, 3, tmp_path,
                                                                                         "at step 5: worse")
    reset = LineageSnapshot.from_response({"head": {"step": 9, "steps_since_publish": 0, "checkpoint": None}})
    assert reset.checkpoint is None and reset.last_reset is None


def test_a_lineage_without_an_adapter_to_load_is_not_measured(tmp_path):
    from learning_tasks import RECIPES as entries
    from lineage_probe import LineageSnapshot, lineage_accuracy

    tasks = [_task(3)]
    assert lineage_accuracy(None, entries["sao"], tasks, "bench") is None
    assert lineage_accuracy(LineageSnapshot(4, 4, None), entries["sao"], tasks, "bench") is None
    # a checkpoint whose adapter/ is missing (a head reset to serving keeps none of its own)
    assert lineage_accuracy(LineageSnapshot(4, 4, tmp_path), entries["sao"], tasks, "bench") is None


def test_the_table_shows_the_lineage_beside_the_served_learner_and_each_decision():
    from collections import Counter

    import learning
    from lineage_probe import LineageSnapshot

    with_head = learning.SeedResult(0, 0.3, 0.3, 0.3, 0.4, Counter(published=1, rejected=2, undecided=3, failed=1),
                                    seconds=60.0, lineage=LineageSnapshot(12, 4, None), lineage_after=0.625)
    no_head = learning.SeedResult(1, 0.3, 0.3, 0.3, 0.3, Counter(), seconds=30.0, settled=False)
    lines = learning.table([with_head, no_head]).splitlines()
    header = lines[0].split()
    assert header[-7:] == ["lineage", "steps", "published", "rejected", "undecided", "other", "wall"]
    row = lines[2].split()
    assert row[5:11] == ["0.625", "12", "1", "2", "3", "1"]
    assert lines[3].split()[5:11] == ["-", "-", "0", "0", "0", "0"] and lines[3].endswith("(not settled)")


def test_a_larger_budget_waits_longer_for_learning_to_settle():
    import learning

    sao = RECIPES["sao"]
    assert learning.settle_timeout(sao, sao.budget) == sao.settle_timeout_s
    assert learning.settle_timeout(sao, sao.budget // 2) == sao.settle_timeout_s  # never less than the recipe's
    assert learning.settle_timeout(sao, 2 * sao.budget) == 2 * sao.settle_timeout_s  # twice the steps to train


def test_registry_entries_are_complete():
    assert {"sao", "gepa", "feedback_rules"} <= set(RECIPES)
    for name, bench in RECIPES.items():
        assert bench.name == name and bench.recipe["name"] == name
        assert bench.gate["name"] == "task_suite" and "tasks" not in bench.gate
        assert bench.budget > 0 and bench.gate_tasks > 0 and bench.heldout_tasks > 0
        for mode in bench.modes:
            assert bench.recipe_config(mode)["name"] == name
        tasks = bench.gate_tasks_config(bench.split(0).gate)
        assert all(t["grader"] == "regex" and re.compile(t["pattern"]) for t in tasks)
    assert RECIPES["sao"].recipe_config("grpo_dis")["mode"] == "grpo_dis"
    assert RECIPES["sao"].temperature > 0  # SAO trains on sampled rollouts
    with pytest.raises(ValueError, match="no mode 'nope'"):
        RECIPES["sao"].recipe_config("nope")


def test_feedback_rules_users_write_the_rule_only_when_wrong():
    bench = RECIPES["feedback_rules"]
    assert bench.feedback(_task(81), "81", 1.0) is None
    assert "number only" in bench.feedback(_task(81), "23 + 58 = 81", 0.0)


@pytest.mark.slow
def test_a_run_completes_and_prints_the_summary_line(tmp_path):
    """One seed of feedback_rules on two real `reef serve` processes with the local model
    (completes and reports; whether it learned is not asserted)."""
    pytest.importorskip("reef_torch")
    run = subprocess.run([sys.executable, str(BENCH / "learning.py"), "feedback_rules", "--seeds", "1", "--budget", "8",
                          "--heldout", "16", "--gate-tasks", "8"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    assert "runtime local" in run.stdout
    m = SUMMARY.match(lines[-1])
    assert m and m.group(1) == "feedback_rules" and m.group(6) == "16" and m.group(8) == "1", lines[-1]


def _follows_rules(body):
    """A model that adds correctly, and answers with the number alone only when its system prompt says so."""
    a, b = map(int, re.findall(r"\d+", last_user_text(body))[:2])
    return str(a + b) if "number only" in system_prompt(body).lower() else f"{a} + {b} = {a + b}"


def test_an_endpoint_run_learns_a_rule_from_feedback_text(capsys):
    """--endpoint: both servers on runtime=upstream; a model that follows the rule it is given
    makes feedback_rules publish, the learner beat the control, and the table say so; ``--seed 2``
    runs that seed alone (``--seeds 1``, seed 0, is the slow tier's real-model run)."""
    import learning

    with FakeUpstream("openai", _follows_rules) as up:
        assert learning.main(["feedback_rules", "--seed", "2", "--budget", "4", "--heldout", "6", "--gate-tasks", "4",
                              "--endpoint", up.url, "--model", "fake-model"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("runtime upstream (fake-model at ") for line in out)
    assert any("; seed(s) 2, 4 reports per seed" in line for line in out), out
    rows = [line.split() for line in out if line.split()[:1] in (["0"], ["1"], ["2"])]
    assert [r[0] for r in rows] == ["2"], out
    row = rows[0]
    assert row[1:5] == ["0.000", "0.000", "0.000", "1.000"] and row[5:8] == ["-", "-", "1"], out  # no lineage: a harness recipe
    assert out[-1].startswith("feedback_rules: learner 1.000±0.000 vs control 0.000±0.000 on 6 held-out tasks, "
                              "1/1 seeds above control, "), out[-1]


REFLECTION = "End every reply with the sum."


def _reflects_and_obeys(body):
    """Both models of the gepa run in one fake: asked to improve an instruction (GEPA's reflection
    prompt quotes the current one between ``` fences), it proposes REFLECTION; asked a sum, it
    gets it right only when its system prompt says REFLECTION, else it adds one."""
    text = last_user_text(body)
    if "```" in text:
        return f"```\n{REFLECTION}\n```"
    a, b = map(int, re.findall(r"\d+", text)[:2])
    return f"{a} + {b} = {a + b if REFLECTION in system_prompt(body) else a + b + 1}"


def test_an_endpoint_run_evolves_the_system_prompt_with_gepa(capsys):
    """gepa through --endpoint: the served model also reflects (reflection: runtime); GEPA's
    reflective mutation writes the instruction that makes the answers right, the gate publishes
    it and the learner beats the control."""
    pytest.importorskip("reef_recipe_gepa")
    import learning

    with FakeUpstream("openai", _reflects_and_obeys) as up:
        assert learning.main(["gepa", "--seeds", "1", "--budget", "8", "--heldout", "6", "--gate-tasks", "4",
                              "--endpoint", up.url, "--model", "fake-model"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "reflection model: the served model" in out
    row = next(line.split() for line in out if line.split()[:1] == ["0"])
    assert row[1:5] == ["0.000", "0.000", "0.000", "1.000"] and row[5:8] == ["-", "-", "1"], out  # no lineage: a harness recipe
    assert out[-1].startswith("gepa: learner 1.000±0.000 vs control 0.000±0.000 on 6 held-out tasks, "), out[-1]


def test_gate_traffic_adds_traffic_tasks_to_the_gate_only():
    import learning

    bench = RECIPES["sao"]
    split = bench.split(0)
    config = learning.server_config(learning.with_gate_traffic(bench, 32), None, 0, split, learning=True)
    assert config["evaluator"]["traffic_tasks"] == 32
    assert len(config["evaluator"]["tasks"]) == bench.gate_tasks  # the gate tasks stay as they were
    assert "traffic_tasks" not in learning.server_config(learning.with_gate_traffic(bench, 0), None, 0, split,
                                                         learning=True)["evaluator"]
    assert "traffic_tasks" not in bench.gate  # the registry entry is not changed


def test_a_negative_gate_traffic_is_refused(capsys):
    import learning

    with pytest.raises(SystemExit) as exited:
        learning.main(["sao", "--gate-traffic", "-1"])
    assert exited.value.code == 2 and "--gate-traffic takes a count" in capsys.readouterr().err


def test_recipe_options_go_over_the_entrys_in_every_server_config(capsys):
    import learning

    bench = RECIPES["sao"]
    changed = learning.with_recipe_options(bench, ["lr=3e-4", "num_critic_only_steps=0", "device=cpu"])
    config = learning.server_config(changed, None, 1, bench.split(1), learning=True)["recipe"]
    assert (config["lr"], config["num_critic_only_steps"], config["device"], config["seed"]) == (3e-4, 0, "cpu", 1)
    assert config["batch_size"] == bench.recipe["batch_size"] and bench.recipe["lr"] == 2e-4  # the entry unchanged
    assert learning.with_recipe_options(bench, []) is bench
    # grpo_dis keeps the lr it was measured at
    assert bench.recipe_config("grpo_dis")["lr"] == 5e-4 and bench.recipe_config(None)["lr"] == 2e-4
    with pytest.raises(SystemExit) as exited:
        learning.main(["sao", "--recipe-option", "lr"])
    assert exited.value.code == 2 and "--recipe-option takes KEY=VALUE, not 'lr'" in capsys.readouterr().err


def test_a_reflection_endpoint_goes_into_the_recipe_config_without_its_key():
    import learning

    spec = learning.reflection_model("http://127.0.0.1:9/v1", "judge-model")
    config = RECIPES["gepa"].recipe_config(None, 0, spec)
    assert config["reflection"] == {"url": "http://127.0.0.1:9/v1", "model": "judge-model",
                                    "api_key": "${oc.env:REEF_REFLECTION_API_KEY,none}"}
    with pytest.raises(ValueError, match="takes no reflection model"):
        RECIPES["sao"].recipe_config(None, 0, spec)
    with pytest.raises(SystemExit, match="--reflection-model"):
        learning.reflection_model("http://127.0.0.1:9/v1", None)


# ------------------------------------------------------------------ sessions (openclaw)


def test_the_hidden_style_counts_words_and_refuses_markup():
    from learning_sessions import plain_and_short

    style = plain_and_short(8)
    assert style("7 + 5 = 12")
    assert not style("7 + 5 = 12. This is a classic example of addition.")  # 11 words
    for marked in ("**12**", "- 12", "## 12", "1. 12", "\\boxed{12}", "Final answer: 12"):
        assert not style(marked), marked


def test_streaks_and_windows_of_a_side():
    from learning_sessions import SideResult

    side = SideResult(passes=[True, False, True, True, False, True, True, True, True])
    assert side.streak_at() == 8 and side.streak_at(2) == 4 and SideResult(passes=[True, True]).streak_at() is None
    assert side.rate(side.passes, 5) == 0.8 and side.rate(side.passes, 4) == 1.0 and side.rate([], 4) == 0.0


def test_the_rule_based_judge_answers_in_the_recipes_format():
    """It speaks through the same interface as a model judge: the recipe's own prompts in, and
    answers the recipe's own parsers read (\\boxed{} votes, a hint between markers)."""
    pytest.importorskip("reef_recipe_openclaw")
    import httpx
    from learning_sessions import SESSION_RECIPES, RuleJudge

    from reef_recipe_openclaw.prm import EVALUATE_SYSTEM, HINT_SYSTEM, parse_boxed, parse_hint

    bench = SESSION_RECIPES["openclaw"].with_student("answers")

    def ask(url, system, next_message):
        user = ("Conversation so far:\n[user] What is 7 + 5?\n\nThe assistant's reply:\n12\n\n"
                f"What came next (the user message):\n{next_message}")
        body = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
        return httpx.post(f"{url}/chat/completions", json=body).json()["choices"][0]["message"]["content"]

    with RuleJudge(bench) as judge:
        assert parse_boxed(ask(judge.url, EVALUATE_SYSTEM, bench.thanks)) == 1
        assert parse_boxed(ask(judge.url, EVALUATE_SYSTEM, bench.correction)) == -1
        assert parse_hint(ask(judge.url, HINT_SYSTEM, bench.correction)) == (1, bench.hint)
        assert parse_hint(ask(judge.url, HINT_SYSTEM, bench.thanks))[0] == -1
        # the student named the right sum: the hint says it, and the style too when that was broken
        wrong = bench.next_message(True, False, Task("add-7-5", "What is 7 + 5?", "12", "5+7"))
        assert parse_boxed(ask(judge.url, EVALUATE_SYSTEM, wrong)) == -1
        assert parse_hint(ask(judge.url, HINT_SYSTEM, wrong)) == (1, "The sum is 12.")
        both = bench.next_message(False, False, Task("add-7-5", "What is 7 + 5?", "12", "5+7"))
        assert parse_hint(ask(judge.url, HINT_SYSTEM, both)) == (1, f"The sum is 12. {bench.hint}")
        assert judge.calls == 7


@pytest.mark.parametrize("student", ["answers", "style"])
def test_the_student_answers_as_it_reads_the_reply(student):
    """The default student reads the style only (thanks for a short wrong sum); ``answers``
    checks the sum against its key too and names the right one."""
    from learning_sessions import SESSION_RECIPES

    bench = SESSION_RECIPES["openclaw"].with_student(student)
    task = Task("add-7-5", "What is 7 + 5?", "12", "5+7")
    assert bench.next_message(True, True, task) == bench.thanks
    assert bench.next_message(False, True, task) == bench.correction
    if student == "answers":
        assert bench.next_message(True, False, task) == "No, that is wrong: it is 12."
        assert bench.next_message(False, False, task) == "No, that is wrong: it is 12. And shorter, please."
    else:
        assert bench.next_message(True, False, task) == bench.thanks
        assert bench.next_message(False, False, task) == bench.correction
    assert SESSION_RECIPES["openclaw"].student == "style"
    with pytest.raises(ValueError, match="--student must be one of style, answers"):
        bench.with_student("teacher")


def test_a_session_summary_line_says_judge_streaks_and_correctness():
    from learning_sessions import SessionSeed, SideResult, session_summary
    from session_gate import LoopOutcome

    def seed(n, lp, cp):
        return SessionSeed(n, SideResult(passes=lp, correct=[True] * len(lp)),
                           SideResult(passes=cp, correct=[False] * len(cp)), LoopOutcome({"published": 2}), True, 60.0)

    seeds = [seed(0, [True] * 4, [False] * 4), seed(1, [False, True, True, True], [True] * 4)]
    line = session_summary("openclaw", "rules", seeds, window=4, sessions=4, minutes=2.0)
    assert line == ("openclaw (rule-based judge): learner 0.875±0.177 vs control 0.500±0.707 pass rate over the last 4 "
                    "of 4 sessions, 3 in a row at session 3/4 vs never/3, correctness 1.000 vs 0.000, "
                    "1/2 seeds above control, 2.0 min")


def test_judge_is_an_option_of_session_recipes_only(capsys):
    import learning

    with pytest.raises(SystemExit):
        learning.main(["sao", "--judge", "rules"])
    assert "unrecognized arguments: --judge rules" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        learning.main(["openclaw", "--judge", "oracle"])
    assert "invalid choice: 'oracle'" in capsys.readouterr().err


@pytest.mark.slow
def test_an_openclaw_run_completes_and_prints_the_summary_line(tmp_path):
    """A few sessions of openclaw with the rule-based judge on two real `reef serve` processes with
    the local model: the sessions run, the loop takes the judged turns, the line comes out
    (whether it learned is not asserted)."""
    pytest.importorskip("reef_torch")
    pytest.importorskip("reef_recipe_openclaw")
    run = subprocess.run([sys.executable, str(BENCH / "learning.py"), "openclaw", "--seeds", "1", "--budget", "16",
                          "--judge", "rules"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "a rule-based judge" in run.stdout
    assert re.match(r"^openclaw \(rule-based judge\): learner \d\.\d{3}±0\.000 vs control \d\.\d{3}±0\.000 pass rate "
                    r"over the last 16 of 16 sessions, 3 in a row at session (\d+|never) vs (\d+|never), "
                    r"correctness \d\.\d{3} vs \d\.\d{3}, [01]/1 seeds above control, \d+\.\d min$",
                    run.stdout.strip().splitlines()[-1]), run.stdout


@pytest.mark.parametrize("recipe", sorted(__import__("learning").DRIVERS))
def test_every_driver_takes_its_command_line(recipe, capsys):
    """A recipe with its own driver gets the command line: --help is the driver's, not the registry's."""
    import learning

    with pytest.raises(SystemExit) as exit_:
        learning.main([recipe, "--help"])
    assert exit_.value.code == 0
    assert "--seeds" in capsys.readouterr().out


@pytest.mark.parametrize("recipe", ["sao", *sorted(__import__("learning").DRIVERS)])
@pytest.mark.parametrize("argv,message", [
    (["--seeds", "2", "--seed", "1"], "not allowed with argument"),
    (["--seed", "1", "--seed", "1"], "--seed names a seed twice (1, 1)"),
    (["--seed", "-1"], "--seed 0 or more"),
    (["--seeds", "0"], "--seeds must be 1 or more"),
])
def test_every_driver_refuses_seeds_it_cannot_run(recipe, argv, message, capsys):
    """``--seeds N`` or ``--seed S`` (repeatable), the same in the registry's runner and every
    driver: both at once, a seed twice or none at all exit before any server starts."""
    import learning

    with pytest.raises(SystemExit) as exit_:
        learning.main([recipe, *argv])
    assert exit_.value.code not in (0, None)
    assert message in capsys.readouterr().err + str(exit_.value.code)


def test_chosen_seeds_keep_the_order_given():
    import argparse

    from learning_tasks import add_seed_options, chosen_seeds, describe_seeds

    parser = argparse.ArgumentParser()
    add_seed_options(parser)
    assert chosen_seeds(parser.parse_args([])) == [0, 1, 2]
    assert chosen_seeds(parser.parse_args(["--seeds", "2"])) == [0, 1]
    assert chosen_seeds(parser.parse_args(["--seed", "1", "--seed", "0", "--seed", "2"])) == [1, 0, 2]
    assert (describe_seeds([0, 1, 2]), describe_seeds([1]), describe_seeds([1, 0])) == \
        ("3 seed(s)", "seed(s) 1", "seed(s) 1, 0")


def test_the_servers_of_a_seed_are_stopped_at_once():
    """A learner still finishing a training step may take a while to stop: the control is told
    at the same time, not after it (a bench killed meanwhile left the control running)."""
    import threading

    import learning

    told = threading.Event()

    class Slow:
        name = "learner"

        def start(self):
            pass

        def wait_ready(self):
            pass

        def stop(self):
            assert told.wait(10), "the control was not told to stop while the learner was stopping"

    class Control(Slow):
        name = "control"

        def stop(self):
            told.set()

    with learning.serving([Slow(), Control()], log=lambda line: None):
        pass
    assert told.is_set()
