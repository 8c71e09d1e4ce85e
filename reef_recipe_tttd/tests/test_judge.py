"""The toy tasks' verifiers and the judge's sandbox."""

from __future__ import annotations

import pytest

from reef_recipe_tttd.judge import Judge, Limits, run_program
from reef_recipe_tttd.tasks import load_task

GOOD = "0.25 0.25 0.25\n0.75 0.25 0.25\n0.5 0.75 0.25"


def test_circles_verifier():
    task = load_task("circles3")
    v = task.verify(GOOD)
    assert v.valid and v.score == pytest.approx(0.75)
    assert not task.verify("0.25 0.25 0.25\n0.75 0.25 0.25").valid  # two circles
    assert not task.verify("0.25 0.25 0.3\n0.75 0.25 0.25\n0.5 0.75 0.25").valid  # leaves the square
    overlap = task.verify("0.25 0.25 0.25\n0.45 0.25 0.25\n0.5 0.75 0.25")
    assert not overlap.valid and overlap.score == 0 and "overlap" in overlap.message
    assert not task.verify("0.5 0.5 0\n0.1 0.1 0.05\n0.9 0.9 0.05").valid  # radius 0
    assert not task.verify("nan 0.5 0.1\n0.1 0.1 0.05\n0.9 0.9 0.05").valid


def test_spread_verifier():
    task = load_task("spread5")
    assert task.verify("0 0.25 0.5 0.75 1").score == pytest.approx(1.0)
    assert task.verify("0.1 0.2 0.3 0.4 0.5").score == pytest.approx(0.4)
    assert not task.verify("0 0 0.5 0.75 1").valid
    assert not task.verify("0 0.25 0.5 0.75 1.5").valid
    assert not task.verify("0 0.5").valid


def test_answers_are_judged_from_the_text():
    judge = Judge(load_task("circles3"))
    assert judge(f"Here:\n```\n{GOOD}\n```").score == pytest.approx(0.75)
    assert judge("").score == 0 and judge("no numbers here").score == 0


@pytest.fixture(scope="module")
def program_judge():
    return Judge(load_task("circles3-program"), Limits(wall_s=5.0, cpu_s=2))


def test_a_program_is_run_and_its_output_rescored(program_judge):
    v = program_judge(f"```python\nprint('''{GOOD}''')\n```")
    assert v.valid and v.score == pytest.approx(0.75)


def test_a_program_cannot_claim_its_score(program_judge):
    v = program_judge("print('0.25 0.25 0.9\\n0.75 0.25 0.25\\n0.5 0.75 0.25')\nprint('score: 99')")
    assert not v.valid and v.score == 0


def test_timeouts_and_crashes_score_zero(program_judge):
    spin = program_judge("while True:\n    pass\n")
    assert (spin.valid, spin.score) == (False, 0.0) and "limit" in spin.message
    crash = program_judge("raise RuntimeError('boom')")
    assert (crash.valid, crash.score) == (False, 0.0) and "boom" in crash.message
    assert program_judge("print('hello')").score == 0


def test_no_escape_from_the_temporary_directory(tmp_path):
    target = tmp_path / "escaped.txt"
    run = run_program(f"open({str(target)!r}, 'w').write('x')", Limits(wall_s=5))
    assert run.returncode != 0 and "PermissionError" in run.stderr and not target.exists()
    for source in ("open('../up.txt', 'w')", "import os; os.remove('/etc/hostname')",
                   "print(open('/etc/hostname').read())", "import subprocess; subprocess.run(['true'])",
                   "import os; os.system('true')", "import socket; socket.create_connection(('127.0.0.1', 80))"):
        run = run_program(source, Limits(wall_s=5))
        assert run.returncode != 0 and "PermissionError" in run.stderr, source
    # inside its own directory a program may work with files, and nothing of it is left behind
    run = run_program("import os\nopen('a.txt', 'w').write('hi')\nprint(open('a.txt').read(), os.getcwd())",
                      Limits(wall_s=5))
    assert run.returncode == 0 and run.stdout.startswith("hi ")
    from pathlib import Path

    assert not Path(run.stdout.split()[1]).exists()


def test_user_tasks_load_by_module_path():
    task = load_task("reef_recipe_tttd.tasks.spread:NumericSpread")
    assert task.name == "spread5"
    with pytest.raises(ValueError):
        load_task("nope")


def test_seed_solutions_are_valid_and_prose_is_ignored():
    for name in ("circles3", "circles5", "spread5"):
        task = load_task(name)
        (seed,) = task.seeds()
        assert task.verify(seed).valid, name
    assert load_task("circles3-program").seeds() == []
    assert load_task("spread5").verify("Sure, here:\n0 0.25 0.5 0.75 1\nThe gap is 0.25.").score == pytest.approx(1.0)
    assert load_task("circles3").verify(f"Answer:\n{GOOD}\nThat is all, 2 of 3.").valid


@pytest.mark.parametrize("line", ["0 0.5 1", "0, 0.5, 1", "0; 0.5; 1.", "  0\t0.5  1  ", "0.0 0.50 1.00"])
def test_a_spread_answer_is_a_line_of_the_numbers_alone(line):
    task = load_task("spread3")
    assert task.verify(f"Here you go:\n{line}\nDone.").score == pytest.approx(1.0)


@pytest.mark.parametrize("prose", [
    "Here are three numbers between 0 and 1 that have a gap of 0.5:",
    "The numbers are 0, 0.5 and 1.",
    "0 0.5 1 is my answer",
    "Two numbers between 0 and 1",
])
def test_a_line_of_prose_is_never_a_spread_answer_though_it_holds_the_numbers(prose):
    """Prose that happens to hold n numbers in [0, 1] would score the best possible without an answer
    (SmolLM2-135M wrote exactly such lines in the discovery bench)."""
    for n in (2, 3):
        verdict = load_task(f"spread{n}").verify(prose)
        assert not verdict.valid and verdict.score == 0.0, (n, prose)
