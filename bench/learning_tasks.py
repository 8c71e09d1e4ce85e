"""What ``bench/learning.py`` asks, how it grades, and how each recipe is set up: one registry entry per recipe.

A recipe's entry (`RecipeBench`) names the task family, the grader, the feedback a user would
write, the recipe's options (and named ``--mode`` variants), the gate (the ``task_suite``
evaluator, whose tasks the bench fills in) and the sampling temperature of the training traffic.
Adding a recipe to the benchmark is adding an entry to `RECIPES`; nothing here imports the recipe.
"""

from __future__ import annotations

import math
import random
import re
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Task:
    """One question with its answer. ``key`` names the problem (``7 + 5`` and ``5 + 7`` share one),
    so training, gate and held-out tasks are disjoint problems, not only disjoint strings."""

    id: str
    prompt: str
    expected: str
    key: str


@dataclass(frozen=True)
class Split:
    """One seed's tasks: the training stream (what the simulated user asks, in order), the gate's
    tasks and the held-out tasks; no problem of one appears in another."""

    train: list[Task]
    gate: list[Task]
    heldout: list[Task]


# ------------------------------------------------------------------ tasks and graders

_INT = re.compile(r"-?\d+")


def first_integer(text: str | None) -> int | None:
    """The first integer written in ``text`` (``"23 + 58 = 81"`` → 23), None when there is none."""
    m = _INT.search(text or "")
    return int(m.group()) if m else None


@dataclass(frozen=True)
class Grader:
    """A 0/1 grade of an answer, and the same test as a regex the gate's ``task_suite`` evaluator
    applies (its ``regex`` grader: ``re.search`` with DOTALL), so the user and the gate agree."""

    name: str
    grade: Callable[[str | None, Task], float]
    pattern: Callable[[Task], str]

    def __call__(self, answer: str | None, task: Task) -> float:
        return self.grade(answer, task)


def _first_integer_is(answer: str | None, task: Task) -> float:
    return 1.0 if first_integer(answer) == int(task.expected) else 0.0


def _first_integer_pattern(task: Task) -> str:
    # anything but a digit or a minus sign that starts a number, then the expected number whole
    return rf"\A(?:[^\d-]|-(?!\d))*{re.escape(task.expected)}(?!\d)"


def last_integer(text: str | None) -> int | None:
    """The last integer written in ``text`` (``"23 + 58 = 81"`` → 81), None when there is none."""
    found = _INT.findall(text or "")
    return int(found[-1]) if found else None


def _last_integer_is(answer: str | None, task: Task) -> float:
    return 1.0 if last_integer(answer) == int(task.expected) else 0.0


def _last_integer_pattern(task: Task) -> str:
    # the expected number whole (no digit or minus before it), then nothing that starts a number
    return rf"(?<![\d-]){re.escape(task.expected)}(?:[^\d-]|-(?!\d))*\Z"


def _number_only(answer: str | None, task: Task) -> float:
    return 1.0 if (answer or "").strip().removesuffix(".").strip() == task.expected else 0.0


def _number_only_pattern(task: Task) -> str:
    return rf"\A\s*{re.escape(task.expected)}\s*\.?\s*\Z"


#: the answer's first integer is the expected one (``"81"``, ``"It is 81."``; not ``"23 + 58 = 81"``)
FIRST_INTEGER = Grader("first_integer", _first_integer_is, _first_integer_pattern)
#: the answer's last integer is the expected one (``"81"``, ``"23 + 58 = 81"``, ``"81."``; not ``"81 + 1"``):
#: what a reader takes as the answer, and what SmolLM2-135M's "a + b = c" replies can earn
LAST_INTEGER = Grader("last_integer", _last_integer_is, _last_integer_pattern)
#: the whole answer is the expected number, a full stop allowed (``"81"``, ``"81."``)
NUMBER_ONLY = Grader("number_only", _number_only, _number_only_pattern)


def addition_problems(low: int, high: int, suffix: str) -> Callable[[], list[Task]]:
    """Every ``a + b`` with ``low <= a, b <= high`` as a task; ``suffix`` follows the question."""

    def problems() -> list[Task]:
        tasks = []
        for a in range(low, high + 1):
            for b in range(low, high + 1):
                prompt = f"What is {a} + {b}?" + (f" {suffix}" if suffix else "")
                tasks.append(Task(id=f"add-{a}-{b}", prompt=prompt, expected=str(a + b), key=f"{min(a, b)}+{max(a, b)}"))
        return tasks

    return problems


def split_tasks(problems: list[Task], seed: int, *, train: int, gate: int, heldout: int, repeats: int = 1) -> Split:
    """Shuffle the problems with ``seed`` and deal them out: held-out first, then the gate, and the
    training stream from what is left: ``train`` questions, each asked ``repeats`` times in a row
    (a group of rollouts of one prompt), a problem again only when the rest runs out. Tasks
    sharing a key go to the same part."""
    groups: dict[str, list[Task]] = {}
    for t in problems:
        groups.setdefault(t.key, []).append(t)
    keys = sorted(groups)
    rng = random.Random(seed)
    rng.shuffle(keys)
    if len(keys) < heldout + gate + 1:
        raise ValueError(f"{len(keys)} distinct problems cannot fill {heldout} held-out and {gate} gate tasks "
                         "and leave any for training")

    def one_each(part: list[str]) -> list[Task]:
        return [rng.choice(groups[k]) for k in part]

    held, gated, rest = keys[:heldout], keys[heldout:heldout + gate], keys[heldout + gate:]
    pool = [t for k in rest for t in groups[k]]
    rng.shuffle(pool)
    stream = [pool[(i // repeats) % len(pool)] for i in range(train)]
    return Split(train=stream, gate=one_each(gated), heldout=one_each(held))


# ------------------------------------------------------------------ the registry


@dataclass(frozen=True)
class RecipeBench:
    """How the benchmark drives one recipe.

    ``recipe`` is the server's ``recipe`` config group (``name`` plus options), ``modes`` maps a
    ``--mode`` value to options over it. ``gate`` is the ``task_suite`` evaluator's options (the
    bench adds ``tasks``). ``feedback(task, answer, score)`` is the text a user would write in the
    report (None: score only). ``temperature`` samples the training traffic; held-out accuracy is
    always measured greedily. A recipe option ``n_samples_per_prompt`` makes the user ask each
    training question that many times in a row; ``seed_option`` names the recipe option that
    gets the bench's seed."""

    name: str
    problems: Callable[[], list[Task]]
    grade: Grader
    recipe: dict[str, Any]
    gate: dict[str, Any]
    temperature: float = 1.0
    max_tokens: int = 16
    budget: int = 256
    gate_tasks: int = 24
    heldout_tasks: int = 64
    feedback: Callable[[Task, str | None, float], str | None] = lambda task, answer, score: None
    modes: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed_option: str | None = None
    #: the recipe option that takes a reflection model ``{url, model, api_key}`` (``--reflection-url``)
    reflection_option: str | None = None
    settle_timeout_s: float = 600.0
    notes: str = ""

    def recipe_config(self, mode: str | None, seed: int | None = None,
                      reflection: dict[str, Any] | None = None) -> dict[str, Any]:
        """The recipe config group with ``mode``'s options over the defaults (and the bench's seed
        in ``seed_option``, when the recipe takes one; ``reflection`` in ``reflection_option``)."""
        if mode is not None and mode not in self.modes:
            known = ", ".join(sorted(self.modes)) or "none"
            raise ValueError(f"recipe {self.name!r} has no mode {mode!r} (modes: {known})")
        if reflection is not None and self.reflection_option is None:
            raise ValueError(f"recipe {self.name!r} takes no reflection model")
        seeded = {self.seed_option: seed} if self.seed_option and seed is not None else {}
        reflecting = {self.reflection_option: reflection} if reflection is not None else {}
        return {**self.recipe, **(self.modes.get(mode) or {}), **seeded, **reflecting}

    def gate_tasks_config(self, tasks: list[Task]) -> list[dict[str, Any]]:
        """The gate's tasks as ``task_suite`` takes them, graded by this recipe's grader as a regex."""
        return [{"id": t.id, "prompt": t.prompt, "pattern": self.grade.pattern(t), "grader": "regex"} for t in tasks]

    def report_metadata(self, task: Task) -> dict[str, Any]:
        """What a report says about its question: the task and the grader's test (``pattern`` with
        ``grader: regex``, as a task suite writes it), so a recipe can grade a fresh answer to it."""
        return {"task": task.id, "pattern": self.grade.pattern(task), "grader": "regex"}

    def with_sizes(self, **sizes: int) -> RecipeBench:
        """This entry with other task counts (``heldout_tasks``, ``gate_tasks``)."""
        return replace(self, **sizes)

    def split(self, seed: int, budget: int | None = None, mode: str | None = None) -> Split:
        repeats = int(self.recipe_config(mode).get("n_samples_per_prompt") or 1)
        return split_tasks(self.problems(), seed, train=budget or self.budget, gate=self.gate_tasks,
                           heldout=self.heldout_tasks, repeats=repeats)


def _greedy_gate(**extra: Any) -> dict[str, Any]:
    # Greedy episodes (one per task and side) keep the gate deterministic and cheap on a CPU;
    # the bootstrap rule still asks for an improvement beyond the tasks' spread.
    return {"name": "task_suite", "grader": "regex", "rule": "bootstrap", "margin": 0.0, "confidence": 0.9,
            "params": {"temperature": 0, "max_tokens": 16}, "episode_timeout_s": 120, "timeout_s": 1200,
            "concurrency": 8, **extra}


def _format_feedback(task: Task, answer: str | None, score: float) -> str | None:
    return None if score >= 1.0 else "Always answer with the number only."


def _correction_feedback(task: Task, answer: str | None, score: float) -> str | None:
    # what a user writes back to a wrong sum: the right one, and that the reply must end with it
    return None if score >= 1.0 else f"Wrong. The answer is {task.expected}; end the reply with the sum."


RECIPES: dict[str, RecipeBench] = {
    "sao": RecipeBench(
        name="sao",
        # operands 1-20: SmolLM2-135M's sampled answers (temperature 0.7) earn a reward about one
        # time in five (operands 10-99 at temperature 1.0: one in fifty, no signal; docs/bench.md)
        problems=addition_problems(1, 20, "Answer with the number only."),
        grade=LAST_INTEGER,
        # a policy gradient from single scored rollouts needs the sampling logprobs: sampled traffic
        temperature=0.7,
        # several optimizer steps per candidate so a gated change is large enough to measure
        # (reef_recipe_sao/README.md); grpo_dis needs groups: 4 rollouts of each prompt in a row.
        # lr: the recipe's default 2e-4; 5e-4 was chosen when every candidate restarted from
        # serving, and with the lineage it drove 5 of 6 lineages into a late reset, where two
        # runs at 2e-4 met the target on every seed (docs/bench.md); grpo_dis keeps the 5e-4 it
        # was measured at
        recipe={"name": "sao", "batch_size": 8, "steps_per_candidate": 4, "lr": 2e-4, "n_samples_per_prompt": 1,
                "num_critic_only_steps": 2},
        modes={"sao": {"mode": "sao"}, "grpo_dis": {"mode": "grpo_dis", "n_samples_per_prompt": 4, "lr": 5e-4}},
        seed_option="seed",
        # greedy over 64 tasks (one round): the sampled gate over 24 tasks (960 episodes) still
        # could not see +0.14, since the tasks' own spread dominates; 64 tasks resolve about +0.12
        # with 128 episodes (docs/bench.md)
        gate=_greedy_gate(),
        gate_tasks=64,
        settle_timeout_s=900.0,
        # 3 seeds in about 20 minutes on 2 cores: a training question costs ~2 s for both servers
        # while the learner trains (measured at 64 reports: 3.4 min a seed, 2 min of it traffic)
        budget=128,
        notes="LoRA policy gradient from single scored rollouts",
    ),
    "gepa": RecipeBench(
        name="gepa",
        # instructions matter here even for SmolLM2-135M (greedy, last integer, operands 1-20):
        # no system prompt 0.29, "Answer with the number only." 0.08, that plus one worked
        # example 0.42 (docs/bench.md)
        problems=addition_problems(1, 20, ""),
        grade=LAST_INTEGER,
        feedback=_correction_feedback,
        temperature=0.0,
        # 60 episodes a step pays for one iteration plus a new seed's validation (2 x 3 + 24 each);
        # the reflection's proposal is an instruction, a few hundred tokens at most
        recipe={"name": "gepa", "batch_size": 8, "max_metric_calls": 60, "minibatch_size": 3,
                "reflection_max_tokens": 384},
        seed_option="seed",
        reflection_option="reflection",
        gate=_greedy_gate(),
        budget=32,
        settle_timeout_s=900.0,
        notes="reflective prompt evolution (GEPA) of the harness from reports with feedback",
    ),
    "feedback_rules": RecipeBench(
        name="feedback_rules",
        problems=addition_problems(10, 99, ""),
        grade=NUMBER_ONLY,
        feedback=_format_feedback,
        temperature=0.0,
        recipe={"name": "feedback_rules", "batch_size": 4, "max_score": 0.5, "proposer": None},
        gate=_greedy_gate(),
        budget=32,
        gate_tasks=16,
        heldout_tasks=32,
        settle_timeout_s=300.0,
        notes="harness rules from the feedback text of low-scored reports",
    ),
}


# ------------------------------------------------------------------ seeds


def add_seed_options(parser: Any) -> None:
    """``--seeds N`` (0..N-1, the default 3) or ``--seed S`` (repeatable: these seeds, in this
    order), the same in every driver of ``bench/learning.py``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--seeds", type=int, default=3, help="seeds to run, 0..N-1 (default 3)")
    group.add_argument("--seed", type=int, action="append", dest="seed_list", metavar="S",
                       help="run seed S (repeatable, in the order given): one seed of a run again, e.g. --seed 1")


def chosen_seeds(args: Any) -> list[int]:
    """The seeds ``add_seed_options`` parsed; ``SystemExit`` for none or a negative one."""
    seeds = list(args.seed_list) if args.seed_list else list(range(args.seeds))
    if not seeds or min(seeds) < 0:
        raise SystemExit("Error: --seeds must be 1 or more and --seed 0 or more")
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"Error: --seed names a seed twice ({', '.join(map(str, seeds))})")
    return seeds


def add_jobs_option(parser: Any) -> None:
    """``--jobs N``: seeds run at once, each with its own servers (the drivers with their own)."""
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="seeds to run at once, each with its own servers (default 1: one after another)")


def chosen_jobs(args: Any) -> int:
    if args.jobs < 1:
        raise SystemExit("Error: --jobs must be 1 or more")
    return args.jobs


def run_seeds(seeds: list[int], jobs: int, run_one: Callable[[int, Callable[[str], None]], Any],
              log: Callable[[str], None], on_abort: Callable[[], None] | None = None) -> list[Any]:
    """``run_one(seed, log)`` for every seed, ``jobs`` at a time; the results in the order of ``seeds``.

    With more than one job each seed's lines carry ``[seed S]``. The workers are daemon threads
    joined with a timeout, so SIGTERM (the drivers' handler raises ``SystemExit``) or Ctrl-C
    reaches the main thread; it calls ``on_abort`` (the drivers pass ``learning.stop_live_servers``:
    an exiting interpreter ends daemon threads without their ``finally``) and re-raises.
    One job, a seed that raises ends the run, as it always did; several, the other seeds go on,
    the failed one is logged and left out of the results, and none finishing is an error."""
    if jobs == 1:
        return [run_one(seed, log) for seed in seeds]
    results: dict[int, Any] = {}
    pending = list(seeds)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                seed = pending.pop(0)
            seed_log = lambda line, s=seed: log(f"[seed {s}] {line}")  # noqa: E731
            try:
                results[seed] = run_one(seed, seed_log)
            except Exception as exc:  # noqa: BLE001 - the other seeds go on; the table has what finished
                seed_log(f"stopped: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(jobs, len(seeds)))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(1.0)
    except BaseException:
        if on_abort is not None:
            on_abort()
        raise
    if not results:
        raise SystemExit("Error: no seed finished (each one's error is above)")
    return [results[seed] for seed in seeds if seed in results]


def describe_seeds(seeds: list[int]) -> str:
    """"3 seed(s)" for 0..2, as every earlier run said; "seed(s) 1, 2" for a choice."""
    if seeds == list(range(len(seeds))):
        return f"{len(seeds)} seed(s)"
    return f"seed(s) {', '.join(map(str, seeds))}"


# ------------------------------------------------------------------ the summary


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt_mean_sd(values: list[float]) -> str:
    mean, sd = mean_sd(values)
    return f"{mean:.3f}±{sd:.3f}"


def summary_line(recipe: str, learner: list[float], control: list[float], n_heldout: int, minutes: float) -> str:
    """The one line every recipe reports: held-out accuracy after learning, learner vs control."""
    above = sum(1 for lrn, ctl in zip(learner, control) if lrn > ctl)
    return (f"{recipe}: learner {fmt_mean_sd(learner)} vs control {fmt_mean_sd(control)} on {n_heldout} held-out tasks, "
            f"{above}/{len(learner)} seeds above control, {minutes:.1f} min")
