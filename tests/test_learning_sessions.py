"""The session bench's gate (bench/session_gate.py, bench/learning_sessions.py): held-out sessions'
prompts graded as the student grades, and what a seed's loop did, read from the server."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from learning_sessions import SESSION_RECIPES, SessionSeed, SideResult, server_config, session_table  # noqa: E402
from learning_tasks import LAST_INTEGER, Task  # noqa: E402
from session_gate import LoopOutcome, PlainAndShort, loop_outcome, pass_pattern  # noqa: E402

OPENCLAW = SESSION_RECIPES["openclaw"]
TASK = Task(id="add-7-15", prompt="What is 7 + 15?", expected="22", key="7+15")


def _gate_passes(reply: str, task: Task = TASK, style: PlainAndShort = OPENCLAW.style) -> bool:
    """What the server's gate does with a task of ``gate_config``: the regex grader (re.search, DOTALL)."""
    return re.search(pass_pattern(style, LAST_INTEGER, task), reply, re.DOTALL) is not None


def _student_passes(reply: str, task: Task = TASK, style: PlainAndShort = OPENCLAW.style) -> bool:
    return style(reply) and LAST_INTEGER(reply, task) >= 1.0


REPLIES = ["22", "7 + 15 = 22", "22.", "The sum is 22", "**22**", "22 is the answer, as 7 + 15 = 22 indeed yes",
           "It is 22 plus", "22 + 1", "\\boxed{22}", "Final answer: 22", "final ANSWER 22", "- 22", "# 22", "1. 22",
           "x\n2) 22", "-22", "122", "22\n", "  22  ", "", "no number", "7 + 15 = 23", "2 2", "22__", "a b c d e f g 22",
           "a b c d e f g h 22", "22\u00a0is\u2003it", "22\tx\ny", "*22*", "+ 22", "+22", "x\n  * 22"]


@pytest.mark.parametrize("reply", REPLIES)
def test_the_gate_passes_a_reply_exactly_when_the_student_does(reply):
    assert _gate_passes(reply) == _student_passes(reply)


_PIECES = st.sampled_from(["22", "7", "15", "-", "+", "=", ".", "**", "__", "#", "*", "1.", "2)", "\\boxed{22}",
                           "final answer", "Final Answer", "The", "sum", "is", "x", "-22", "220"])
_SPACE = st.sampled_from([" ", "  ", "\n", "\t", "\n  ", "\u00a0", "\u2003", "\x1c", "\r\n", ""])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_PIECES, _SPACE), max_size=14), st.integers(1, 20), st.integers(1, 12))
def test_the_gate_regex_and_the_student_agree_on_any_reply(parts, expected, max_words):
    """Schema-driven replies (numbers, markup, words and every kind of whitespace, in any order and
    count): the regex the gate runs and the Python the student runs give the same verdict."""
    reply = "".join(piece + space for piece, space in parts)
    task = Task(id="t", prompt="?", expected=str(expected), key="k")
    style = PlainAndShort(max_words)
    assert _gate_passes(reply, task, style) == _student_passes(reply, task, style), repr(reply)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_the_gate_regex_and_the_student_agree_on_any_text(reply):
    assert _gate_passes(reply) == _student_passes(reply), repr(reply)


def test_counting_words_does_not_backtrack_into_words():
    """A long reply of long words fails fast (each word is taken whole), not in exponential time:
    a pathological pattern would hang here."""
    reply = " ".join(["abcdefghij" * 5] * 40) + " 22"
    assert not _gate_passes(reply)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_gate_asks_prompts_of_sessions_never_trained_on(seed):
    split = OPENCLAW.split(seed, 72)
    assert len(split.train) == 72 and len(split.gate) == OPENCLAW.gate_tasks and not split.heldout
    assert not {t.key for t in split.train} & {t.key for t in split.gate}
    # disjoint as strings too: what the gate's contamination check compares
    assert not {t.prompt for t in split.train} & {t.prompt for t in split.gate}
    assert len({t.key for t in split.gate}) == len(split.gate)
    assert OPENCLAW.split(seed, 72) == split and OPENCLAW.split(seed + 1, 72).gate != split.gate


def test_the_learner_is_gated_by_a_task_suite_it_accepts():
    """The learner's config names task_suite (not the recipe's default ``always``) with the held-out
    prompts, sampled as the sessions are, and the pass test; the evaluator takes it as the server
    would and plans its two rounds of two episodes a prompt and side."""
    from reef_core.builtins.evaluators import TaskSuiteEvaluator

    split = OPENCLAW.split(0, 24)
    learner = server_config(OPENCLAW, 0, split, judge="rules", judge_url="http://127.0.0.1:9/v1", learning=True)
    control = server_config(OPENCLAW, 0, split, judge="rules", judge_url="http://127.0.0.1:9/v1", learning=False)
    assert learner["loop"]["enabled"] and not control["loop"]["enabled"]
    assert {k: v for k, v in learner.items() if k != "loop"} == {k: v for k, v in control.items() if k != "loop"}
    options = dict(learner["evaluator"])
    assert options.pop("name") == "task_suite"
    assert options["params"] == {"temperature": OPENCLAW.temperature, "max_tokens": OPENCLAW.max_tokens}
    assert [t["prompt"] for t in options["tasks"]] == [t.prompt for t in split.gate]
    assert all(t["grader"] == "regex" for t in options["tasks"])
    evaluator = TaskSuiteEvaluator(**options)
    assert len(evaluator.tasks) == OPENCLAW.gate_tasks
    assert evaluator.sequential and evaluator.selection_problem() is None
    assert evaluator.repeats == 2 and evaluator.planned_rounds(len(evaluator.tasks), 2, greedy=False) == 2
    graded = {t["id"]: evaluator.graders["regex"] for t in evaluator.tasks}
    task = evaluator.tasks[0]
    expected = next(t.expected for t in split.gate if t.id == task["id"])
    assert graded[task["id"]](expected, task) == 1.0
    assert graded[task["id"]](f"**{expected}**", task) == 0.0


def _server(rows: list[dict], head: dict | None):
    """A server's read routes as the real ones answer them (``httpx.MockTransport``)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/reef/scenarios/bench/candidates":
            assert request.url.params["limit"] == "1000"
            return httpx.Response(200, json={"scenario": "bench", "candidates": rows})
        assert request.url.path == "/reef/scenarios/bench/lineage"
        return httpx.Response(200, json={"scenario": "bench", "head": head, "serving_release_id": "r1"})

    class Server:
        http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://reef")

    return Server()


def _row(n: int, status: str, metrics: dict | None = None) -> dict:
    return {"id": f"cand-{n:02d}", "status": status, "created_at": f"2026-12-01T10:{n:02d}:00",
            "evaluation": {"evaluator": "task_suite", "metrics": metrics} if metrics else None}


def test_a_seeds_loop_outcome_counts_candidates_and_reads_the_lineage():
    statuses = ["published"] * 2 + ["rejected"] * 3 + ["undecided", "error", "evaluating"]
    rows = [_row(n, status) for n, status in enumerate(statuses)]
    rows[0]["evaluation"] = {"metrics": {"candidate_mean": 0.5, "current_mean": 0.25, "improvement": 0.25,
                                         "interval": [0.1, 0.4], "rounds": 1, "max_rounds": 4}}
    loop = loop_outcome(_server(rows[::-1], {"step": 9, "steps_since_publish": 4}), "bench")
    assert [loop.count(s) for s in ("published", "rejected", "undecided", "other")] == [2, 3, 1, 2]
    assert (loop.lineage_step, loop.steps_since_publish) == (9, 4)
    assert loop.brief() == ("published 2, rejected 3, undecided 1, other 2 (error 1, evaluating 1); lineage step 9 "
                            "(4 since the last publish)")
    # oldest first, and what the gate measured where it measured
    assert loop.verdicts[0] == ("cand-00 published: candidate 0.500 vs serving 0.250, improvement +0.250 "
                                "[+0.100, +0.400] after 1 of 4 round(s)")
    assert loop.verdicts[-1] == "cand-07 evaluating"
    rows[1]["artifact"] = {"reports": 24, "metadata": {"lineage": {"step": 6, "head": "h"}}}
    assert loop_outcome(_server(rows, None), "bench").verdicts[1] == "cand-01 published (lineage step 6, 24 report(s))"
    none = loop_outcome(_server([], None), "bench")
    assert none.lineage_step is None and none.brief() == ("published 0, rejected 0, undecided 0, other 0; "
                                                          "no lineage")


def test_the_session_table_shows_the_gates_outcomes_and_the_lineage():
    seed = SessionSeed(0, SideResult(passes=[True]), SideResult(passes=[False]),
                       LoopOutcome({"published": 2, "rejected": 5, "undecided": 1}, lineage_step=8), True, 60.0)
    head, _, row = session_table([seed], window=1).splitlines()
    assert head.split()[-10:] == ["held-out", "L", "held-out", "C", "head", "published", "rejected", "undecided",
                                  "lineage", "wall"]
    assert row.split()[-9:] == ["-", "-", "-", "2", "5", "1", "8", "1.0", "m"]
    seed.heldout, seed.lineage_heldout = {"learner": 0.25, "control": 0.125}, 0.5
    assert session_table([seed], window=1).splitlines()[2].split()[-9:-6] == ["0.250", "0.125", "0.500"]


def test_the_lineage_probe_grades_a_reply_as_a_session_passes():
    task = OPENCLAW.split(0, 8).gate[0]
    assert OPENCLAW.grade(f"It is {task.expected}.", task) == 1.0
    assert OPENCLAW.grade(f"**{task.expected}**", task) == 0.0               # the style breaks
    assert OPENCLAW.grade("It is 1000.", task) == 0.0                          # the sum is wrong
    assert OPENCLAW.grade(None, task) == 0.0                                   # no content at all


def test_model_flag_serves_and_trains_a_local_model_directory(tmp_path, monkeypatch):
    import signal

    import learning_sessions

    seen = {}
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # main's SIGTERM handler, not this worker's
    monkeypatch.setattr(learning_sessions, "run", lambda args, runtime, log: seen.setdefault("runtime", runtime) and 0)
    learning_sessions.main(["openclaw", "--model", str(tmp_path), "--device", "cuda"])
    runtime = seen.pop("runtime")
    assert runtime.overrides == ("runtime=local",) and runtime.options == {"model": str(tmp_path), "device": "cuda"}
    assert not runtime.local  # the in-process lineage probe decodes with the embedded model only
    learning_sessions.main(["openclaw"])
    assert seen.pop("runtime").local  # the embedded model by default
    with pytest.raises(SystemExit, match="not a directory"):
        learning_sessions.main(["openclaw", "--model", str(tmp_path / "missing")])


def test_gate_flags_sample_the_gate_and_bound_its_rounds(tmp_path, monkeypatch):
    """``--gate-temperature 0.3 --gate-repeats 3 --gate-rounds 3``: the learner's gate samples the
    held-out prompts at 0.3, 3 episodes a prompt and side a round, and its cap holds 3 such
    rounds, as the evaluator plans them; 0 is greedy; bad values stop with one line."""
    import signal

    import learning_sessions

    from reef_core.builtins.evaluators import TaskSuiteEvaluator

    bench = OPENCLAW.with_gate(0.3, 3, 3)
    assert OPENCLAW.gate_sampling == OPENCLAW.temperature and OPENCLAW.with_gate() == OPENCLAW
    assert OPENCLAW.with_gate(0.0).gate_sampling == 0.0
    # the cap is counted in rounds: more repeats a round keep the rounds, so the cap grows
    assert OPENCLAW.gate_config([])["max_episodes"] == 2 * 2 * OPENCLAW.gate_tasks * 2
    assert OPENCLAW.with_gate(repeats=4).gate_config([])["max_episodes"] == 2 * 2 * OPENCLAW.gate_tasks * 4
    split = bench.split(0, 24)
    options = dict(server_config(bench, 0, split, judge="rules", judge_url="http://127.0.0.1:9/v1",
                                 learning=True)["evaluator"])
    assert options.pop("name") == "task_suite"
    assert options["params"]["temperature"] == 0.3 and options["repeats"] == 3
    evaluator = TaskSuiteEvaluator(**options)
    assert evaluator.planned_rounds(len(evaluator.tasks), 3, greedy=False) == 3
    for bad in (["--gate-temperature", "-1"], ["--gate-repeats", "0"], ["--gate-rounds", "0"], ["--jobs", "0"]):
        monkeypatch.setattr(signal, "signal", lambda *args: None)
        with pytest.raises(SystemExit, match="must be"):
            learning_sessions.main(["openclaw", "--judge", "rules", *bad])
