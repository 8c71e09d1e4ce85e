"""The learning bench for recipes that learn overnight from a day of agent work (``skillclaw``).

Each seed runs DAYS days of tasks on two real ``reef serve`` processes, the LEARNER (loop on,
``evaluator=always``: every night that changes the pool publishes, and the next day is the
measurement, as in SkillClaw's own protocol) and a frozen CONTROL whose pool never changes;
same tasks, same order, greedy answers. The agent sends its own system prompt and one question
per session (``x-reef-session``); the server injects the pool's skill catalogue in front of it.
The user grades each answer (the last integer) and reports it with the receipt: a wrong answer
gets feedback that says so, and every ``unscored_every``-th task is reported with the unscored
sentinel −1 (the night's judge scores it). The day's last report fills the batch; the night runs.

The criterion is SkillClaw's, fixed in advance: the learner's final day beats the control's mean
day by more than 2 control standard deviations (one-sided; control days differ by their tasks).

Evolvers: ``--evolver model`` (the served model itself, the recipe's default), ``--evolver
scripted`` (an OpenAI-compatible endpoint in this process that answers every night step in the
recipe's format and KNOWS THE RIGHT SKILL TEXT: an upper bound of the plumbing, not of the
method), or ``--evolver-url URL --evolver-model NAME`` (any capable model; the key is read by the
server from ``$REEF_EVOLVER_API_KEY``, never written to a file).
"""

from __future__ import annotations

import json
import random
import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chat_endpoint import ChatEndpoint
from learning_tasks import LAST_INTEGER, Task, add_seed_options, addition_problems, chosen_seeds, describe_seeds, fmt_mean_sd

SCENARIO = "bench"
CONCURRENCY = 8
#: the agent's own system prompt; the server puts the skill catalogue in front of it
AGENT_SYSTEM = "You are a helpful assistant."
SKILL_NAME = "sums"
#: the skill the scripted evolver writes: its description is what the catalogue shows the model
SKILL_DESCRIPTION = "Answer with the number only. Example: User: What is 3 + 4? Assistant: 7"
SKILL_BODY = ("Add the two numbers of 'What is a + b?' and reply with the sum alone, as digits.\n\n"
              "Example:\nUser: What is 3 + 4?\nAssistant: 7")


@dataclass(frozen=True)
class DayBench:
    """How the bench drives an overnight recipe: the task family, the days, the recipe's options."""

    name: str
    problems: Callable[[], list[Task]]
    days: int = 4
    tasks_per_day: int = 24
    unscored_every: int = 4
    max_tokens: int = 24
    recipe: dict[str, Any] = field(default_factory=dict)
    settle_timeout_s: float = 900.0
    notes: str = ""

    def plan(self, seed: int, days: int | None = None, per_day: int | None = None) -> list[list[Task]]:
        """The tasks of each day for ``seed``: distinct tasks (as long as the family lasts), the
        same for learner and control."""
        tasks = self.problems()
        random.Random(seed).shuffle(tasks)
        days, per_day = days or self.days, per_day or self.tasks_per_day
        return [[tasks[(d * per_day + i) % len(tasks)] for i in range(per_day)] for d in range(days)]

    def recipe_config(self, evolver: Any, per_day: int) -> dict[str, Any]:
        return {**self.recipe, "batch_size": per_day, "evolver": evolver}


DAY_RECIPES: dict[str, DayBench] = {
    "skillclaw": DayBench(
        name="skillclaw",
        problems=addition_problems(1, 20, ""),
        # the catalogue is all a plain API client's model sees of a skill, so it counts as used;
        # replies are short (a 135M evolver rambles), retries few (a local call does not flap)
        recipe={"name": "skillclaw", "catalogue_counts_as_use": True, "retries": 2, "backoff_s": 0.5,
                "summary_max_tokens": 96, "judge_max_tokens": 96, "decide_max_tokens": 160,
                "merge_max_tokens": 160, "max_sessions_per_group": 12, "digest_chars": 1200},
        notes="a day of sums (1-20) grows the skill pool overnight (SkillClaw)",
    ),
}


def report_for(task: Task, answer: str | None, index: int, unscored_every: int) -> tuple[float, float, str | None]:
    """(true score, reported score, feedback) of one task: the grade, the −1 sentinel on every
    ``unscored_every``-th task (0: never), and feedback on a wrong scored answer."""
    score = LAST_INTEGER(answer or "", task)
    if unscored_every and index % unscored_every == unscored_every - 1:
        return score, -1.0, None
    feedback = None if score >= 1.0 else (f"Wrong: {task.prompt} is {task.expected}. "
                                          "Answer with the number only.")
    return score, score, feedback


def criterion(learner_final: float, control_days: list[float]) -> tuple[bool, float]:
    """SkillClaw's gain criterion: (met, threshold), threshold = control mean + 2 control sd."""
    mean = statistics.fmean(control_days)
    sd = statistics.stdev(control_days) if len(control_days) > 1 else 0.0
    threshold = mean + 2 * sd
    return learner_final > threshold, threshold


# ------------------------------------------------------------------ the scripted evolver


class ScriptedEvolver(ChatEndpoint):
    """An OpenAI-compatible endpoint answering the skillclaw night's prompts in their format with
    the right skill already known: the no-skill bucket creates ``sums``; the ``sums`` group gets
    its description set when it differs, and a skip once it is right; a merge keeps the right
    text. An upper bound of the plumbing (what the loop does with a perfect evolver), not of the method."""

    model = "scripted-evolver"

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def reply(self, messages: list[dict[str, Any]]) -> str:
        return self.answer(str((messages or [{}])[-1].get("content") or ""))

    def answer(self, prompt: str) -> str:
        step = ("summarize" if prompt.startswith("You review") else "judge" if prompt.startswith("You grade")
                else "merge" if "A new version of the skill" in prompt
                else "create" if "Today's sessions without a skill" in prompt else "decide")
        self.calls[step] = self.calls.get(step, 0) + 1
        if step == "summarize":
            wrong = "Reported score: 0" in prompt
            return ("The user asked for a sum. " + ("The agent's reply did not end with the right number."
                                                     if wrong else "The agent gave the sum."))
        if step == "judge":
            return json.dumps({"task_completion": 0.5, "response_quality": 0.5, "efficiency": 1.0, "tool_usage": 1.0,
                               "reason": "the reply is not checked here"})
        skill = {"name": SKILL_NAME, "description": SKILL_DESCRIPTION, "content": SKILL_BODY}
        if step == "merge":
            return json.dumps({"description": SKILL_DESCRIPTION, "content": SKILL_BODY})
        if step == "create":
            return json.dumps({"action": "create_skill", "fault": "skill", **skill,
                               "rationale": "sums answered with prose; a worked example shows the form"})
        if f'Current skill "{SKILL_NAME}":\ndescription: {SKILL_DESCRIPTION}\n' in prompt:
            return json.dumps({"action": "skip", "fault": "agent", "rationale": "the skill is right"})
        return json.dumps({"action": "optimize_description", "fault": "skill", "name": SKILL_NAME,
                           "description": SKILL_DESCRIPTION, "rationale": "the trigger text lacks the example"})


def evolver_option(kind: str, url: str | None = None, model: str | None = None) -> Any:
    """The recipe's ``evolver`` option: the runtime, the scripted endpoint at ``url``, or a model endpoint."""
    if kind == "model":
        return "runtime"
    if kind == "scripted":
        return {"url": url, "model": "scripted-evolver"}
    return {"url": url, "model": model, "api_key": "${oc.env:REEF_EVOLVER_API_KEY,none}"}


# ------------------------------------------------------------------ one seed


@dataclass
class DaysSeed:
    seed: int
    learner: list[float]
    control: list[float]
    published: int
    pool: list[str]
    settled: bool
    seconds: float

    @property
    def met(self) -> bool:
        return criterion(self.learner[-1], self.control)[0]


def run_task(server: Any, bench: DayBench, task: Task, index: int, tag: str) -> float:
    """One task of a day: ask (greedy), grade, report; the true score."""
    headers = {"x-reef-session": f"{tag}-{index}-{uuid.uuid4().hex[:6]}", "x-reef-tag-bench": "day"}
    receipt, answer = server.chat([{"role": "system", "content": AGENT_SYSTEM},
                                   {"role": "user", "content": task.prompt}],
                                  temperature=0.0, max_tokens=bench.max_tokens, headers=headers)
    score, reported, feedback = report_for(task, answer, index, bench.unscored_every)
    server.report(receipt, reported, feedback, {"task": task.id})
    return score


def run_days_seed(bench: DayBench, seed: int, *, days: int, per_day: int, evolver: Any, runtime: Any,
                  workdir: Path, log: Callable[[str], None]) -> DaysSeed:
    from learning import ReefProcess, serving

    start = time.monotonic()
    plan = bench.plan(seed, days, per_day)

    def config(learning: bool) -> dict[str, Any]:
        return {"server": {"default_scenario": SCENARIO, "log_level": "warning"},
                "recipe": bench.recipe_config(evolver, per_day), "loop": {"enabled": learning, "schedule_s": None}}

    servers = {"learner": ReefProcess(f"seed{seed}-learner", workdir, config(True), runtime, evaluator="always"),
               "control": ReefProcess(f"seed{seed}-control", workdir, config(False), runtime, evaluator="always")}
    scores: dict[str, list[float]] = {"learner": [], "control": []}
    settled = True
    with serving(servers.values(), log):
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            for day, tasks in enumerate(plan):
                for side, server in servers.items():
                    tag = f"s{seed}d{day}"
                    got = list(pool.map(lambda it, server=server, tag=tag: run_task(server, bench, it[1], it[0], tag),
                                        enumerate(tasks)))
                    scores[side].append(sum(got) / len(got))
                time.sleep(1.0)  # the day's last report lands; the night starts
                settled = servers["learner"].wait_settled(bench.settle_timeout_s) and settled
                loop = servers["learner"].loop_state()
                log(f"  seed {seed} day {day + 1}/{len(plan)}: learner {scores['learner'][-1]:.3f}, control "
                    f"{scores['control'][-1]:.3f}; learner loop {loop.get('state')} after {loop.get('steps', 0)} "
                    f"night(s) ({time.monotonic() - start:.0f} s)")
        learner = servers["learner"]
        tree = learner.http.get("/reef/harness").json() if learner.candidates().get("published") else {"files": []}
        pool_names = sorted(f["path"].split("/")[1] for f in tree.get("files", []) if f["path"].startswith("skills/"))
        return DaysSeed(seed, scores["learner"], scores["control"], learner.candidates().get("published", 0),
                        pool_names, settled, time.monotonic() - start)


# ------------------------------------------------------------------ the report


def days_table(results: list[DaysSeed]) -> str:
    head = f"{'seed':>4}  {'learner by day':<32}  {'control by day':<32}  {'threshold':>9}  {'met':>3}  {'nights':>6}  pool"
    rows = [head, "-" * len(head)]
    for r in results:
        met, threshold = criterion(r.learner[-1], r.control)
        rows.append(f"{r.seed:>4}  {' '.join(f'{x:.2f}' for x in r.learner):<32}  "
                    f"{' '.join(f'{x:.2f}' for x in r.control):<32}  {threshold:>9.3f}  {'yes' if met else 'no':>3}  "
                    f"{r.published:>6}  {','.join(r.pool) or '-'}" + ("" if r.settled else "  (not settled)"))
    return "\n".join(rows)


def days_summary(name: str, evolver: str, results: list[DaysSeed], days: int, per_day: int, minutes: float) -> str:
    """The one line: final day learner vs control mean day, the 2-sd criterion per seed."""
    final = [r.learner[-1] for r in results]
    control = [statistics.fmean(r.control) for r in results]
    met = sum(r.met for r in results)
    return (f"{name} ({evolver}): learner final day {fmt_mean_sd(final)} vs control mean day {fmt_mean_sd(control)} "
            f"over {days} days of {per_day} tasks, {met}/{len(results)} seeds beat control mean + 2 sd, "
            f"{sum(r.published for r in results)} night(s) published, {minutes:.1f} min")


def main(argv: list[str]) -> int:
    """``bench/learning.py skillclaw [--seeds 3] [--days N] [--tasks-per-day N] [--evolver scripted|model]
    [--evolver-url URL --evolver-model NAME]``."""
    import argparse
    import signal
    import sys
    import tempfile
    from contextlib import nullcontext

    from learning import Runtime

    parser = argparse.ArgumentParser(prog="bench/learning.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", choices=sorted(DAY_RECIPES))
    add_seed_options(parser)
    parser.add_argument("--days", type=int, help="days per seed (default: the recipe's)")
    parser.add_argument("--tasks-per-day", type=int, help="tasks a day, the recipe's batch (default: the recipe's)")
    parser.add_argument("--evolver", choices=["model", "scripted"], default="model",
                        help="the served model (the recipe's default) or the scripted evolver that knows the skill")
    parser.add_argument("--evolver-url", help="OpenAI-compatible base URL of the evolver; key from $REEF_EVOLVER_API_KEY")
    parser.add_argument("--evolver-model", help="the model name at --evolver-url")
    args = parser.parse_args(argv)
    seeds = chosen_seeds(args)
    if args.evolver_url and not args.evolver_model:
        parser.error("--evolver-url needs --evolver-model, the model name the endpoint serves")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    bench = DAY_RECIPES[args.recipe]
    days, per_day = args.days or bench.days, args.tasks_per_day or bench.tasks_per_day
    if days < 2:
        parser.error("--days must be 2 or more (a control needs a spread, the learner a night)")
    kind = "endpoint" if args.evolver_url else args.evolver
    described = {"model": "the served model as evolver",
                 "scripted": "a scripted evolver that knows the right skill (an upper bound of the plumbing, not of "
                             "the method)",
                 "endpoint": f"{args.evolver_model} at {args.evolver_url} as evolver"}[kind]
    runtime = Runtime.choose(None, None)
    def log(line: str) -> None:
        print(line, flush=True)

    log(f"recipe {bench.name}: {bench.notes}")
    log(f"runtime {runtime.description}; {described}; {describe_seeds(seeds)}, {days} days of {per_day} tasks, greedy; "
        f"every {bench.unscored_every}th report unscored (-1); gate: evaluator=always (the next day is the measurement)")
    start = time.monotonic()
    results = []
    scripted = ScriptedEvolver() if kind == "scripted" else None
    with tempfile.TemporaryDirectory(prefix="reef-bench-days-") as tmp:
        with scripted or nullcontext():
            evolver = evolver_option(kind, scripted.url if scripted else args.evolver_url, args.evolver_model)
            for seed in seeds:
                results.append(run_days_seed(bench, seed, days=days, per_day=per_day, evolver=evolver, runtime=runtime,
                                             workdir=Path(tmp), log=log))
    log("")
    log(days_table(results))
    log(days_summary(bench.name, {"model": "the served model as evolver", "scripted": "scripted evolver",
                                  "endpoint": f"evolver {args.evolver_model}"}[kind], results, days, per_day,
                     (time.monotonic() - start) / 60))
    return 0
