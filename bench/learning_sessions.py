"""The learning bench for recipes that learn from what happens next (``openclaw``): sessions, no reports.

A simulated student works through short homework sessions on two real ``reef serve`` processes
(the LEARNER with its loop on, a frozen CONTROL with it off; same sessions, same order). Each
session is one question: the student asks it, reads the reply, and answers with a correction
when the reply breaks its hidden style, with thanks otherwise; the assistant replies once more
and the session ends. ``--student answers`` is a student who also checks the sum against its
answer key and corrects a wrong one, naming the right one (measured worse on the 135M model,
which does not learn to add from these sessions: docs/recipes/openclaw.md). The student never
states its preference and posts no report: the learner's recipe pairs each reply with the
student's next message (``x-reef-session``), a judge rates it, and the loop trains, gates and
hot-swaps on its own. Its gate is ``task_suite`` on the first prompts of held-out sessions
(problems no training session asks), sampled as the sessions are and graded as a session passes
(``bench/session_gate.py``): a candidate serves only when it passes more of them than the
serving release does. ``--gate-temperature T`` (0: greedy),
``--gate-repeats N`` episodes a prompt and side a round and ``--gate-rounds N`` change it.
``--jobs N`` runs up to N seeds at once.

A session PASSES when the first reply has the preferred style and contains the correct result
(style alone is reward hacking, so correctness is reported on its own too). Per seed: the session
at which three passes in a row were first reached, the pass rate over the last ``window``
sessions, and correctness over the same window, learner and control; and the learner's
candidates by outcome (published, rejected, undecided) and its lineage's head step.

The judge is the recipe's default (the served model on its frozen base) or, with
``--judge rules``, a RULE-BASED JUDGE: an OpenAI-compatible endpoint in this process that reads
the student's next message (thanks: +1, a correction: −1 with a hint that restates it as an
instruction). It answers in the recipe's judge format (``\\boxed{}``, hint markers) through the
same ``openai`` judge interface as any model would, so it measures the learner, not the judge.

``--model DIR`` serves and trains a local Hugging Face model instead of the embedded SmolLM2-135M
(``--device`` where it runs): a session passes only with the correct sum, which the 135M model
gets about a fifth of the time, so "3 passes in a row" needs a more capable model.
"""

from __future__ import annotations

import re
import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chat_endpoint import ChatEndpoint
from learning_tasks import (
    LAST_INTEGER,
    Grader,
    Split,
    Task,
    add_jobs_option,
    add_seed_options,
    addition_problems,
    chosen_jobs,
    chosen_seeds,
    describe_seeds,
    fmt_mean_sd,
    run_seeds,
    split_tasks,
)
from lineage_probe import lineage_accuracy
from session_gate import LoopOutcome, PlainAndShort, gate_tasks_config, loop_outcome

SCENARIO = "bench"
CONCURRENCY = 8
#: who the student is: one that reads the style only, or the sum too
STUDENTS = ("style", "answers")
#: how long the last turns of a round take to be judged into reports (the rule-based judge: well under it)
JUDGED_S = 3.0

# ------------------------------------------------------------------ the student


def plain_and_short(max_words: int) -> PlainAndShort:
    """The hidden style: at most ``max_words`` words and no AI-style markup (bold, headers,
    lists, ``\\boxed``, "final answer"); ``.pattern()`` is the same test as a regex."""
    return PlainAndShort(max_words)


@dataclass(frozen=True)
class SessionBench:
    """How the bench drives a next-state recipe: the questions, the hidden style, what the
    student says back, the recipe's options, how many sessions a seed runs and the learner's
    gate: ``task_suite`` options (``gate``) over ``gate_tasks`` prompts of held-out sessions,
    sampled as the sessions' first replies are and graded as a session passes."""

    name: str
    problems: Callable[[], list[Task]]
    correct: Grader
    style: PlainAndShort
    style_notes: str
    correction: str
    thanks: str
    #: what the rule-based judge's hint says after a correction (an instruction, not a quote)
    hint: str
    recipe: dict[str, Any]
    #: what the student says to a wrong sum (``{expected}``: the right one), and after it when the
    #: style is broken too; the judge's hint for it
    wrong_sum: str = "No, that is wrong: it is {expected}."
    also_style: str = "And shorter, please."
    sum_hint: str = "The sum is {expected}."
    #: ``style``: the student reads the style only; ``answers``: the sum too
    student: str = "style"
    sessions: int = 72
    window: int = 32
    temperature: float = 0.6
    max_tokens: int = 48
    followup_max_tokens: int = 8
    #: recipe options for each judge: ``model`` (the recipe's default judge) and ``rules``
    judges: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the ``task_suite`` evaluator's options; ``gate_config`` adds the tasks and the sampling
    gate: dict[str, Any] = field(default_factory=dict)
    gate_tasks: int = 16
    #: rounds the gate may run before it says undecided (sets the evaluator's ``max_episodes``;
    #: None: the evaluator's own cap, or the ``max_episodes`` in ``gate``)
    gate_rounds: int | None = None
    #: the gate's sampling temperature (None: the sessions' ``temperature``; 0: greedy)
    gate_temperature: float | None = None
    #: after each round of sessions, wait up to this many seconds for the learner's loop to take
    #: what the round taught (its step, gate and hot swap) before the next round (None: the
    #: sessions run back to back, as fast as the servers answer)
    pace_s: float | None = None
    settle_timeout_s: float = 600.0
    notes: str = ""

    def split(self, seed: int, sessions: int | None = None) -> Split:
        """The seed's sessions in order (``train``: one first question each) and the gate's
        tasks (``gate``): problems no session asks (``7 + 5`` and ``5 + 7`` are one problem)."""
        return split_tasks(self.problems(), seed, train=sessions or self.sessions, gate=self.gate_tasks, heldout=0)

    def grade(self, reply: str | None, task: Task) -> float:
        """1.0 when ``reply`` passes the session (the style and the sum), else 0.0 (the held-out
        measure and the lineage probe grade with it)."""
        reply = reply or ""
        return 1.0 if self.style(reply) and self.correct(reply, task) >= 1.0 else 0.0

    @property
    def gate_sampling(self) -> float:
        """The temperature the gate samples each held-out prompt at."""
        return self.temperature if self.gate_temperature is None else self.gate_temperature

    def gate_config(self, tasks: list[Task]) -> dict[str, Any]:
        """The learner's ``evaluator`` config: ``task_suite`` on ``tasks`` at the first reply's
        sampling (the serving window also holds the 8-token follow-ups, so it is set here)."""
        cap = {} if self.gate_rounds is None else {"max_episodes": self.gate_episodes(self.gate_rounds)}
        return {**self.gate, **cap, "params": {"temperature": self.gate_sampling, "max_tokens": self.max_tokens},
                "tasks": gate_tasks_config(tasks, self.style, self.correct)}

    def gate_episodes(self, rounds: int) -> int:
        """The evaluator's ``max_episodes`` for ``rounds`` rounds: every side's episodes, as the
        evaluator's planned_rounds divides it."""
        from reef_core.commit.tasks import SIDES

        return rounds * len(SIDES) * self.gate_tasks * int(self.gate.get("repeats", 1))

    def next_message(self, reply_styled: bool, reply_correct: bool, task: Task) -> str:
        """What the student says after the first reply."""
        if self.student == "answers" and not reply_correct:
            wrong = self.wrong_sum.format(expected=task.expected)
            return wrong if reply_styled else f"{wrong} {self.also_style}"
        return self.thanks if reply_styled else self.correction

    def hint_for(self, next_message: str) -> str | None:
        """The rule-based judge's hint for the student's ``next_message``: None after thanks, else
        what it asked for as an instruction (the sum it named, the style)."""
        if next_message == self.thanks:
            return None
        named = re.escape(self.wrong_sum).replace(re.escape("{expected}"), r"(-?\d+)")
        found = re.match(named, next_message)
        if not found:
            return self.hint
        sum_hint = self.sum_hint.format(expected=found.group(1))
        return sum_hint if next_message == found.group(0) else f"{sum_hint} {self.hint}"

    def with_student(self, student: str | None) -> SessionBench:
        """This bench with the student ``answers`` or ``style`` (None keeps the bench's)."""
        if student is None:
            return self
        if student not in STUDENTS:
            raise ValueError(f"--student must be one of {', '.join(STUDENTS)}, not {student!r}")
        return replace(self, student=student)

    def with_gate(self, temperature: float | None = None, repeats: int | None = None,
                  rounds: int | None = None) -> SessionBench:
        """This bench with the gate sampled at ``temperature`` (0: greedy), ``repeats`` episodes a
        task and side a round, up to ``rounds`` rounds (None keeps what the bench has).

        ``ValueError`` for a value the gate cannot use."""
        if temperature is not None and not 0 <= temperature <= 2:
            raise ValueError("--gate-temperature must be between 0 and 2")
        if (repeats is not None and repeats < 1) or (rounds is not None and rounds < 1):
            raise ValueError("--gate-repeats and --gate-rounds must be 1 or more")
        gate = dict(self.gate)
        if repeats is not None:
            gate["repeats"] = repeats
        return replace(self, gate=gate, gate_temperature=self.gate_temperature if temperature is None else temperature,
                       gate_rounds=self.gate_rounds if rounds is None else rounds)

    def recipe_config(self, judge: str, seed: int, judge_url: str | None = None) -> dict[str, Any]:
        if judge not in self.judges:
            raise ValueError(f"recipe {self.name!r} has no judge {judge!r} (judges: {', '.join(sorted(self.judges))})")
        options = dict(self.judges[judge])
        if judge == "rules":
            options["judge"] = {"name": "openai", "url": judge_url, "model": "rule-based-judge"}
        return {**self.recipe, **options, "seed": seed}


SESSION_RECIPES: dict[str, SessionBench] = {
    "openclaw": SessionBench(
        name="openclaw",
        problems=addition_problems(1, 20, ""),
        correct=LAST_INTEGER,
        style=plain_and_short(8),
        style_notes="at most 8 words, no markup",
        correction="No, that is too long. Shorter, please.",
        thanks="Thanks!",
        hint="Keep the reply to one short line: the sum and nothing else.",
        # LoRA on a 135M model: the reference's lr 1e-5 (full weights of a 4B model) moves nothing in
        # 72 sessions; turns of the last two releases still train (a swap after every step)
        # Under a real gate the lineage runs ahead of serving: the recipe's max_staleness (64) lets
        # it (2, set for the `always` gate, reset it every third unpublished step), the PPO ratio
        # corrects for the lag, and a step takes every batch that waited through the last gate
        # (max_batches), so the lineage keeps pace with the sessions
        recipe={"name": "openclaw", "batch_size": 8, "max_batches": 4, "lr": 2e-4, "steps_per_batch": 2,
                "prm_max_tokens": 96, "top_k": 4},
        judges={"model": {}, "rules": {}},
        # 48 held-out sessions' prompts sampled as the sessions are (0.6), 2 episodes a prompt and
        # side a round, up to 2 rounds (384 episodes: gate_rounds). Greedy (one round, 96 episodes) the gate saw
        # only the first step: once the greedy reply had the style, what later steps taught (the
        # style under sampling, what the students meet) did not change it, and two of three seeds
        # stalled; sampled, every seed published 3 times (docs/recipes/openclaw.md)
        gate={"name": "task_suite", "grader": "regex", "rule": "bootstrap", "margin": 0.0, "confidence": 0.9,
              "repeats": 2, "episode_timeout_s": 120, "timeout_s": 1800, "concurrency": 8},
        gate_tasks=48,
        gate_rounds=2,
        gate_temperature=None,
        # a round of 8 sessions is one batch: the loop trains, gates and swaps before the next round,
        # as between a deployment's sessions (back to back, 72 sessions took 4 minutes and the loop
        # finished its first step after the traffic had ended)
        pace_s=600.0,
        # a sampled gate of 2 rounds took up to 10 minutes on 2 cores shared with other runs
        settle_timeout_s=1800.0,
        notes="binary RL + hindsight distillation from the student's next message (OpenClaw-RL)",
    ),
}

# ------------------------------------------------------------------ the rule-based judge


class RuleJudge(ChatEndpoint):
    """An OpenAI-compatible endpoint that judges like the recipe's PRM prompts ask, by rule:
    the text after the prompt's last ``"):\\n"`` is the next message; thanks is progress (+1),
    anything else a correction (−1) with ``hint`` on the hint prompt."""

    model = "rule-based-judge"

    def __init__(self, bench: SessionBench):
        super().__init__()
        self.bench = bench
        self.calls = 0

    def reply(self, messages: list[dict[str, Any]]) -> str:
        self.calls += 1
        system = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
        prompt = str(messages[-1].get("content") or "") if messages else ""
        next_message = prompt.rsplit("):\n", 1)[-1].strip()
        hint = self.bench.hint_for(next_message)
        if "HINT_START" in system:  # the hindsight-hint prompt
            return "\\boxed{-1}" if hint is None else f"\\boxed{{1}} [HINT_START]{hint}[HINT_END]"
        return "\\boxed{1}" if hint is None else "\\boxed{-1}"


# ------------------------------------------------------------------ one seed


@dataclass
class SideResult:
    passes: list[bool] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    styled: list[bool] = field(default_factory=list)

    def streak_at(self, length: int = 3) -> int | None:
        """The 1-based session at which ``length`` passes in a row were first reached."""
        run = 0
        for i, ok in enumerate(self.passes, 1):
            run = run + 1 if ok else 0
            if run >= length:
                return i
        return None

    def rate(self, values: list[bool], window: int) -> float:
        tail = values[-window:]
        return sum(tail) / len(tail) if tail else 0.0


@dataclass
class SessionSeed:
    seed: int
    learner: SideResult
    control: SideResult
    #: the learner's candidates by outcome and its lineage's head step
    loop: LoopOutcome
    settled: bool
    seconds: float
    #: greedy pass rate on the gate's held-out prompts once learning settled: what the learner
    #: serves, what the control serves, and the learner's lineage head (None: not measured)
    heldout: dict[str, float] = field(default_factory=dict)
    lineage_heldout: float | None = None


def run_session(server: Any, bench: SessionBench, task: Task, seed: int, index: int) -> tuple[bool, bool, bool]:
    """One homework session; returns (passed, correct, styled) of the first reply."""
    session = f"s{seed}-{index}-{uuid.uuid4().hex[:6]}"
    headers = {"x-reef-session": session, "x-reef-tag-bench": "session"}
    messages = [{"role": "user", "content": task.prompt}]
    _, reply = server.chat(messages, temperature=bench.temperature, max_tokens=bench.max_tokens, headers=headers)
    reply = reply or ""
    styled, correct = bench.style(reply), bench.correct(reply, task) >= 1.0
    nxt = bench.next_message(styled, correct, task)
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": nxt}]
    server.chat(messages, temperature=bench.temperature, max_tokens=bench.followup_max_tokens, headers=headers)
    return styled and correct, correct, styled


def server_config(bench: SessionBench, seed: int, split: Split, *, judge: str, judge_url: str | None,
                  learning: bool) -> dict[str, Any]:
    """The YAML config of one server: the recipe, the gate on ``split.gate`` and the loop (on
    for the learner, off for the frozen control; the control's gate never runs)."""
    return {"server": {"default_scenario": SCENARIO, "log_level": "warning"},
            "recipe": bench.recipe_config(judge, seed, judge_url),
            "evaluator": bench.gate_config(split.gate),
            "loop": {"enabled": learning, "schedule_s": None}}


def run_sessions_seed(bench: SessionBench, seed: int, *, sessions: int, judge: str, judge_url: str | None,
                      runtime: Any, workdir: Path, log: Callable[[str], None], pace: bool = True) -> SessionSeed:
    from learning import ReefProcess, accuracy, serving

    start = time.monotonic()
    split = bench.split(seed, sessions)
    tasks = split.train
    pace_s = bench.pace_s if pace else None
    learner, control = (ReefProcess(f"seed{seed}-{side}", workdir,
                                    server_config(bench, seed, split, judge=judge, judge_url=judge_url,
                                                  learning=side == "learner"),
                                    runtime, evaluator=bench.gate["name"]) for side in ("learner", "control"))
    results = {"learner": SideResult(), "control": SideResult()}
    servers = {"learner": learner, "control": control}
    with serving(servers.values(), log):
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            for i in range(0, len(tasks), CONCURRENCY):
                chunk = list(enumerate(tasks[i:i + CONCURRENCY], i))
                for side, server in servers.items():
                    for passed, correct, styled in pool.map(
                            lambda it, server=server: run_session(server, bench, it[1], seed, it[0]), chunk):
                        results[side].passes.append(passed)
                        results[side].correct.append(correct)
                        results[side].styled.append(styled)
                done = i + len(chunk)
                if pace_s and done < len(tasks):
                    time.sleep(JUDGED_S)  # the round's last turns are judged off the request path
                    if not learner.wait_settled(pace_s):
                        log(f"  seed {seed}: the learner's loop was still busy {pace_s:.0f} s after session {done}")
                if done % (CONCURRENCY * 3) == 0 or done == len(tasks):
                    loop = learner.loop_state()
                    lr, ct = results["learner"], results["control"]
                    log(f"  seed {seed}: {done}/{len(tasks)} sessions, passes learner {sum(lr.passes)} "
                        f"control {sum(ct.passes)}, style learner {sum(lr.styled)} control {sum(ct.styled)}; "
                        f"learner loop {loop.get('state')} after {loop.get('steps', 0)} step(s) "
                        f"({time.monotonic() - start:.0f} s)")
        # the last sessions' turns are judged off the request path: let the loop take what it has
        time.sleep(JUDGED_S)
        settled = learner.wait_settled(bench.settle_timeout_s)
        loop = loop_outcome(learner, SCENARIO)
        log(f"  seed {seed}: learner candidates {loop.brief()} ({time.monotonic() - start:.0f} s)")
        for line in loop.verdicts:
            log(f"    {line}")
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            # the report bench's held-out measure: greedy, no session (a held-out prompt never trains)
            heldout = {side: accuracy(server, bench, split.gate, pool) for side, server in servers.items()}
        snapshot = learner.lineage()
    # measured with both servers stopped, so the probe has the cores to itself
    head = lineage_accuracy(snapshot, bench, split.gate, SCENARIO) if runtime.local else None
    log(f"  seed {seed}: greedy pass rate on the {len(split.gate)} held-out prompts: served {heldout['learner']:.3f}, "
        f"control {heldout['control']:.3f}, lineage head {'-' if head is None else f'{head:.3f}'} "
        f"({time.monotonic() - start:.0f} s)")
    return SessionSeed(seed, results["learner"], results["control"], loop, settled, time.monotonic() - start,
                       heldout=heldout, lineage_heldout=head)


# ------------------------------------------------------------------ the report


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _streak(value: int | None) -> str:
    return "never" if value is None else str(value)


def session_table(results: list[SessionSeed], window: int) -> str:
    head = (f"{'seed':>4}  {'3-in-a-row L':>12}  {'3-in-a-row C':>12}  {f'pass@last{window} L':>14}  "
            f"{f'pass@last{window} C':>14}  {'correct L':>9}  {'correct C':>9}  {'style L':>7}  {'style C':>7}  "
            f"{'held-out L':>10}  {'held-out C':>10}  {'head':>5}  "
            f"{'published':>9}  {'rejected':>8}  {'undecided':>9}  {'lineage':>7}  {'wall':>7}")
    rows = [head, "-" * len(head)]
    for r in results:
        lr, ct = r.learner, r.control
        rows.append(f"{r.seed:>4}  {_streak(lr.streak_at()):>12}  {_streak(ct.streak_at()):>12}  "
                    f"{lr.rate(lr.passes, window):>14.3f}  {ct.rate(ct.passes, window):>14.3f}  "
                    f"{lr.rate(lr.correct, window):>9.3f}  {ct.rate(ct.correct, window):>9.3f}  "
                    f"{lr.rate(lr.styled, window):>7.3f}  {ct.rate(ct.styled, window):>7.3f}  "
                    f"{_rate(r.heldout.get('learner')):>10}  {_rate(r.heldout.get('control')):>10}  "
                    f"{_rate(r.lineage_heldout):>5}  "
                    f"{r.loop.count('published'):>9}  {r.loop.count('rejected'):>8}  "
                    f"{r.loop.count('undecided'):>9}  {'-' if r.loop.lineage_step is None else r.loop.lineage_step:>7}  "
                    f"{r.seconds / 60:>5.1f} m"
                    + ("" if r.settled else "  (not settled)"))
    return "\n".join(rows)


def session_summary(name: str, judge: str, results: list[SessionSeed], window: int, sessions: int,
                    minutes: float) -> str:
    """The one line: last-window pass rate learner vs control, when 3 in a row came, correctness."""
    lp = [r.learner.rate(r.learner.passes, window) for r in results]
    cp = [r.control.rate(r.control.passes, window) for r in results]
    lc = [r.learner.rate(r.learner.correct, window) for r in results]
    cc = [r.control.rate(r.control.correct, window) for r in results]
    above = sum(1 for a, b in zip(lp, cp) if a > b)
    streaks = "/".join(_streak(r.learner.streak_at()) for r in results)
    control_streaks = "/".join(_streak(r.control.streak_at()) for r in results)
    judged = "rule-based judge" if judge == "rules" else "the served model as judge"
    return (f"{name} ({judged}): learner {fmt_mean_sd(lp)} vs control {fmt_mean_sd(cp)} pass rate over the last "
            f"{window} of {sessions} sessions, 3 in a row at session {streaks} vs {control_streaks}, "
            f"correctness {statistics.fmean(lc):.3f} vs {statistics.fmean(cc):.3f}, "
            f"{above}/{len(results)} seeds above control, {minutes:.1f} min")


def main(argv: list[str]) -> int:
    """``bench/learning.py openclaw [--seeds 3] [--budget SESSIONS] [--judge model|rules]
    [--student answers|style] [--model DIR] [--device cuda]``."""
    import argparse
    import signal
    import sys

    from learning import Runtime

    parser = argparse.ArgumentParser(prog="bench/learning.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", choices=sorted(SESSION_RECIPES))
    add_seed_options(parser)
    parser.add_argument("--budget", type=int, help="sessions per seed (default: the recipe's)")
    parser.add_argument("--judge", choices=["model", "rules"], default="model",
                        help="the served model on its frozen base (the recipe's default) or the rule-based judge")
    parser.add_argument("--student", choices=STUDENTS, default=None,
                        help="style (the default): the student corrects the style only; answers: the style and a "
                             "wrong sum, naming the right one")
    parser.add_argument("--no-pace", dest="pace", action="store_false",
                        help="run the sessions back to back instead of letting the learner's loop take each round "
                             "of them before the next")
    parser.add_argument("--model", default=None, metavar="DIR",
                        help="a local Hugging Face model directory to serve and train instead of the embedded "
                             "SmolLM2-135M (a capable model, e.g. on a GPU machine: the student's sums need one)")
    parser.add_argument("--device", default="auto", help="where that model runs: auto, cpu, cuda, cuda:1 ...")
    parser.add_argument("--gate-temperature", type=float, default=None, metavar="T",
                        help="sample the gate's held-out prompts at T (0: greedy; default: the sessions' 0.6)")
    parser.add_argument("--gate-repeats", type=int, default=None, metavar="N",
                        help="episodes per held-out prompt and side in a round of the gate (sampled gates)")
    parser.add_argument("--gate-rounds", type=int, default=None, metavar="N",
                        help="rounds the gate may run before it says undecided")
    add_jobs_option(parser)
    args = parser.parse_args(argv)
    runtime = Runtime.local_model(args.model, args.device)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return run(args, runtime, log=lambda line: print(line, flush=True))


def run(args: Any, runtime: Any, log: Callable[[str], None] = print) -> int:
    """Every seed, the table and the summary line."""
    import tempfile
    from contextlib import nullcontext

    from learning import stop_live_servers

    judge = args.judge or "model"
    try:
        bench = SESSION_RECIPES[args.recipe].with_gate(args.gate_temperature, args.gate_repeats, args.gate_rounds)
        bench = bench.with_student(getattr(args, "student", None))
        bench.recipe_config(judge, 0, "http://127.0.0.1:9/v1")
    except ValueError as exc:
        raise SystemExit(f"Error: {exc}") from None
    jobs = chosen_jobs(args)
    sessions = args.budget or bench.sessions
    window = min(bench.window, sessions)
    log(f"recipe {bench.name}: {bench.notes}")
    seeds = chosen_seeds(args)
    log(f"runtime {runtime.description}; {describe_seeds(seeds)}, {sessions} sessions per seed, replies at temperature "
        f"{bench.temperature}; hidden style: {bench.style_notes}; the student corrects "
        + ("the style and a wrong sum (naming the right one)" if bench.student == "answers" else "the style only")
        + "; judge: "
        + ("a rule-based judge (thanks +1, a correction -1 with a hint), not a model" if judge == "rules"
           else "the served model on its frozen base (the recipe's default)"))
    gate = bench.gate
    log(f"gate: {gate['name']} on {bench.gate_tasks} held-out sessions' prompts (a pass: the style and the sum), "
        f"temperature {bench.gate_sampling}, {gate.get('repeats', 'auto')} repeat(s) a round, up to "
        f"{bench.gate_config([]).get('max_episodes', 'auto')} episodes, {gate.get('rule')} at {gate.get('confidence')}, margin "
        f"{gate.get('margin', 0.0):g}")
    if bench.pace_s and args.pace:
        log(f"pacing: after each round of {CONCURRENCY} sessions, up to {bench.pace_s:.0f} s for the learner's loop to "
            "take what it taught (--no-pace: back to back)")
    if jobs > 1:
        log(f"{jobs} seeds at a time, each with its own servers")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reef-bench-sessions-") as tmp, \
            (RuleJudge(bench) if judge == "rules" else nullcontext()) as judge_server:
        results = run_seeds(seeds, jobs, lambda seed, seed_log: run_sessions_seed(
            bench, seed, sessions=sessions, judge=judge, judge_url=judge_server.url if judge_server else None,
            runtime=runtime, workdir=Path(tmp), log=seed_log, pace=args.pace), log, on_abort=stop_live_servers)
    log("")
    log(session_table(results, window))
    log(session_summary(bench.name, judge, results, window, sessions, (time.monotonic() - start) / 60))
    return 0
