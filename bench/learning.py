"""Does the learning loop make the agent better? The one benchmark every learning recipe reports on.

For each seed it starts two real ``reef serve`` processes with the same configuration, a
LEARNER (``loop.enabled=true``) and a frozen CONTROL (``loop.enabled=false``), each with its own
state directory, port and token. A simulated user asks both the same training questions in the
same order through the official ``openai`` SDK, grades every answer exactly and posts a report
quoting the receipt (score 1.0 or 0.0, plus feedback text where the recipe's user writes some).
The learner's own loop learns, gates (``task_suite`` on gate tasks) and hot-swaps; the bench
never calls recipe code. Held-out accuracy (greedy, tasks used neither for training nor for the
gate) is measured through each server's chat endpoint before the traffic and after learning
settled.

Usage:
    python bench/learning.py RECIPE [--seeds 3] [--budget N] [--mode MODE]
                             [--endpoint URL --model NAME] [--heldout N] [--gate-tasks N]
                             [--reflection-url URL --reflection-model NAME] [--settle-timeout S]

``--endpoint`` runs both servers with ``runtime=upstream`` against an OpenAI-compatible endpoint
(key from ``$REEF_UPSTREAM_API_KEY``) instead of the local SmolLM2-135M-Instruct. The last line
printed is the summary: ``<recipe>: learner <mean±sd> vs control <mean±sd> on <n> held-out
tasks, <k>/<seeds> seeds above control, <minutes> min``. Recipes: see bench/learning_tasks.py.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from reef_core.testing.serve_process import ServeProcess

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_tasks import (  # noqa: E402
    RECIPES,
    RecipeBench,
    Split,
    Task,
    add_seed_options,
    chosen_seeds,
    describe_seeds,
    summary_line,
)
from lineage_probe import LineageSnapshot, lineage_accuracy  # noqa: E402

#: recipes whose user is not "ask, grade, report": their own driver module in bench/, whose
#: ``main(argv)`` takes the whole command line (``RECIPE`` first) and prints the summary line last
DRIVERS = {"openclaw": "learning_sessions", "skillclaw": "learning_days", "tttd": "learning_discovery"}

SCENARIO = "bench"
#: requests in flight per server: the local runtime decodes up to 8 sequences in one forward
CONCURRENCY = 8
READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Runtime:
    """Which runtime both servers use: the local model, or ``upstream`` at an endpoint."""

    overrides: tuple[str, ...]
    description: str
    #: ``runtime`` options for the config file (a URL is safer there than on a Hydra command line)
    options: dict[str, Any] = field(default_factory=dict)
    #: the embedded model in-process too (what the lineage probe decodes with)
    local: bool = False

    @classmethod
    def choose(cls, endpoint: str | None, model: str | None) -> Runtime:
        if endpoint is None:
            return cls(("runtime=local",), "local (the embedded SmolLM2-135M-Instruct, reef-torch)", local=True)
        if not model:
            raise SystemExit("Error: --endpoint needs --model, the model name the endpoint serves")
        return cls(("runtime=upstream",), f"upstream ({model} at {endpoint})",
                   {"upstream_url": endpoint, "model": model})

    @classmethod
    def local_model(cls, model: str | None, device: str = "auto") -> Runtime:
        """reef-torch serving (and training) the embedded SmolLM2-135M, or the local Hugging Face
        model directory ``model`` instead (a capable one, e.g. on a GPU machine), on ``device``.
        Only the embedded model is ``local`` (what the in-process lineage probe decodes with)."""
        if model is None and device == "auto":
            return cls.choose(None, None)
        if model is not None and not os.path.isdir(model):
            raise SystemExit(f"Error: --model {model!r} is not a directory (a local Hugging Face model)")
        name = model or "the embedded SmolLM2-135M-Instruct"
        return cls(("runtime=local",), f"local ({name} on {device}, reef-torch)",
                   {**({"model": model} if model else {}), "device": device})


def reflection_model(url: str | None, model: str | None) -> dict[str, Any] | None:
    """The recipe's reflection model at ``--reflection-url``; the key is read by the server from
    ``$REEF_REFLECTION_API_KEY`` (the config file names the variable, never the secret)."""
    if url is None:
        return None
    if not model:
        raise SystemExit("Error: --reflection-url needs --reflection-model, the model name the endpoint serves")
    return {"url": url, "model": model, "api_key": "${oc.env:REEF_REFLECTION_API_KEY,none}"}


def with_gate_traffic(bench: RecipeBench, tasks: int) -> RecipeBench:
    """``bench`` whose gate also draws up to ``tasks`` tasks from the scenario's scored traffic
    (``task_suite``'s ``traffic_tasks``: the reports carry the grader's pattern); as it is for 0."""
    return replace(bench, gate={**bench.gate, "traffic_tasks": tasks}) if tasks else bench


def with_recipe_options(bench: RecipeBench, pairs: list[str]) -> RecipeBench:
    """``bench`` with ``KEY=VALUE`` recipe options over its registry entry's (each value read as
    YAML, and a string that is a number as the number: ``lr=2e-4``); ``ValueError`` for a pair
    without a key."""
    import yaml

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--recipe-option takes KEY=VALUE, not {pair!r}")
        parsed = yaml.safe_load(value) if value.strip() else None
        if isinstance(parsed, str):  # YAML 1.1 reads 2e-4 (no dot) as a string
            try:
                parsed = float(parsed)
            except ValueError:
                pass
        options[key.strip()] = parsed
    return replace(bench, recipe={**bench.recipe, **options}) if options else bench


def server_config(bench: RecipeBench, mode: str | None, seed: int, split: Split, *, learning: bool,
                  reflection: dict[str, Any] | None = None) -> dict[str, Any]:
    """The YAML config file of one server (everything but the state dir, port and runtime)."""
    return {
        "server": {"default_scenario": SCENARIO, "log_level": "warning"},
        "recipe": bench.recipe_config(mode, seed, reflection),
        "evaluator": {**bench.gate, "tasks": bench.gate_tasks_config(split.gate)},
        "loop": {"enabled": learning, "schedule_s": None},
    }


class ReefProcess(ServeProcess):
    """A bench server (``reef_core.testing.serve_process``): ``python -m reef_core serve -c
    <file>`` on a free loopback port with its own state directory and admin token, the runtime
    both servers share, and half the machine's cores for torch."""

    def __init__(self, name: str, workdir: Path, config: dict[str, Any], runtime: Runtime,
                 evaluator: str | None = "task_suite"):
        self.name = name
        (workdir / name).mkdir(parents=True)  # a fresh state directory, never a previous run's
        config = dict(config)
        if runtime.options:
            config["runtime"] = dict(runtime.options)
        # Two servers share the machine: each gets half the cores for torch. With every server
        # on all of them (torch's default), a training step next to decoding in the other server
        # ran 3.8x slower than alone instead of 2x (2 cores: 9.1 s vs 2.4 s a step; 4.0 s at one
        # thread each), and the seed's traffic stalled behind it.
        threads = str(max(1, (os.cpu_count() or 2) // 2))
        super().__init__(workdir / name, config,
                         [*runtime.overrides, *([f"evaluator={evaluator}"] if evaluator else [])],
                         token=secrets.token_urlsafe(16), scenario=SCENARIO,
                         env={"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads},
                         label=f"{name} server", ready_timeout=READY_TIMEOUT_S, http_timeout=120.0)

    # ---------------------------------------------------------------- what a user does

    def chat(self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int,
             headers: dict[str, str]) -> tuple[str, str | None]:
        """The reply to ``messages`` and its receipt."""
        raw = self.openai.chat.completions.with_raw_response.create(
            model=self.model, messages=messages, temperature=temperature, max_tokens=max_tokens,
            extra_headers=headers)
        answer = raw.parse().choices[0].message.content
        return raw.headers["x-reef-agent-record-id"], answer

    def ask(self, task: Task, *, temperature: float, max_tokens: int, tag: str) -> tuple[str, str | None]:
        """The answer to ``task`` and its receipt."""
        return self.chat([{"role": "user", "content": task.prompt}], temperature=temperature, max_tokens=max_tokens,
                         headers={"x-reef-tag-bench": tag})

    def report(self, receipt: str, score: float, feedback: str | None, metadata: dict[str, Any]) -> None:
        body: dict[str, Any] = {"references": [receipt], "score": score, "metadata": metadata}
        if feedback:
            body["feedback"] = feedback
        self.http.post("/reef/report", json=body).raise_for_status()

    # ---------------------------------------------------------------- what the loop did

    def loop_state(self) -> dict[str, Any]:
        return self.http.get(f"/reef/scenarios/{SCENARIO}").json().get("loop") or {}

    def candidates(self) -> Counter:
        rows = self.http.get(f"/reef/scenarios/{SCENARIO}/candidates", params={"limit": 1000}).json()["candidates"]
        return Counter(c["status"] for c in rows)

    def lineage(self) -> LineageSnapshot | None:
        return LineageSnapshot.from_response(self.http.get(f"/reef/scenarios/{SCENARIO}/lineage").json())

    def wait_settled(self, timeout: float) -> bool:
        """Wait until no growth step runs and fewer reports are eligible than the recipe's batch
        (as the loop reports it), twice in a row a second apart so a step about to start is not
        missed; False after ``timeout``."""
        deadline, calm = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            loop = self.loop_state()
            idle = loop.get("state", "idle") == "idle" and loop.get("eligible", 0) < loop.get("batch_size", 1)
            calm = calm + 1 if idle else 0
            if calm >= 2:
                return True
            time.sleep(1.0)
        return False


#: the servers of every ``serving`` block not yet left, for ``stop_live_servers``
_LIVE: set[ServeProcess] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all(servers: Iterable[ServeProcess]) -> None:
    servers = list(servers)
    with ThreadPoolExecutor(max(1, len(servers))) as pool:
        list(pool.map(lambda s: s.stop(), servers))


def stop_live_servers() -> None:
    """Stop every server a ``serving`` block started and has not stopped yet.

    Seeds run at once (``--jobs``) live in daemon threads, and an interpreter leaving on SIGTERM
    ends those without running their ``finally``: the servers, each in a session of its own,
    would outlive the bench. ``learning_tasks.run_seeds`` calls this when it is interrupted."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    _stop_all(servers)


@contextmanager
def serving(servers: Iterable[ReefProcess], log: Callable[[str], None] = print) -> Iterator[None]:
    """Start ``servers`` and wait until each is ready; on an error print each one's log tail;
    always stop them (SIGINT, a clean shutdown), all at once: a learner finishing a training
    step may take a while to exit, and the control must not wait for it to be told."""
    servers = list(servers)
    with _LIVE_LOCK:
        _LIVE.update(servers)
    try:
        for s in servers:
            s.start()
        for s in servers:
            s.wait_ready()
        yield
    except Exception:
        for s in servers:
            log(f"--- {s.name} log tail ---\n{s.log_tail()}")
        raise
    finally:
        _stop_all(servers)
        with _LIVE_LOCK:
            _LIVE.difference_update(servers)


# ------------------------------------------------------------------ one seed


@dataclass
class SeedResult:
    seed: int
    control_before: float
    control_after: float
    learner_before: float
    learner_after: float
    candidates: Counter = field(default_factory=Counter)
    traffic_reward: float = 0.0
    settled: bool = True
    seconds: float = 0.0
    #: the learner's lineage when learning settled, and its head's held-out accuracy (None:
    #: a recipe without a lineage, or no head to measure)
    lineage: LineageSnapshot | None = None
    lineage_after: float | None = None


def accuracy(server: ReefProcess, bench: RecipeBench, tasks: list[Task], pool: ThreadPoolExecutor) -> float:
    """Held-out accuracy: greedy answers through the server's chat endpoint, graded by the recipe's grader."""

    def one(task: Task) -> float:
        _, answer = server.ask(task, temperature=0.0, max_tokens=bench.max_tokens, tag="heldout")
        return bench.grade(answer, task)

    scores = list(pool.map(one, tasks))
    return sum(scores) / len(scores)


def drive(server: ReefProcess, bench: RecipeBench, tasks: list[Task], pool: ThreadPoolExecutor) -> float:
    """The simulated user on one chunk of training traffic: ask, grade, report. Returns the mean score."""

    def one(task: Task) -> float:
        receipt, answer = server.ask(task, temperature=bench.temperature, max_tokens=bench.max_tokens, tag="train")
        score = bench.grade(answer, task)
        server.report(receipt, score, bench.feedback(task, answer, score), bench.report_metadata(task))
        return score

    return sum(pool.map(one, tasks))


def settle_timeout(bench: RecipeBench, budget: int) -> float:
    """The recipe's settle timeout for ``budget`` reports: its own for its default budget or
    fewer, and in proportion beyond it (each report feeds the same share of a training step)."""
    return bench.settle_timeout_s * max(1.0, budget / bench.budget)


def run_seed(bench: RecipeBench, seed: int, *, budget: int, mode: str | None, runtime: Runtime,
             workdir: Path, log: Any = print, reflection: dict[str, Any] | None = None,
             pace_s: float | None = None) -> SeedResult:
    """One seed; ``pace_s``: after each chunk of traffic, wait up to that long for the learner's
    loop to take what it can (a full batch is a step, its gate and hot swap) before the next, so
    what it publishes serves the traffic that follows (None: the traffic runs back to back)."""
    start = time.monotonic()
    split = bench.split(seed, budget, mode)
    configs = {side: server_config(bench, mode, seed, split, learning=side == "learner", reflection=reflection)
               for side in ("learner", "control")}
    learner = ReefProcess(f"seed{seed}-learner", workdir, configs["learner"], runtime)
    control = ReefProcess(f"seed{seed}-control", workdir, configs["control"], runtime)
    servers = (learner, control)
    with serving(servers, log):
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            before = {s.name: accuracy(s, bench, split.heldout, pool) for s in servers}
            log(f"  seed {seed}: held-out before: learner {before[learner.name]:.3f}, "
                f"control {before[control.name]:.3f} ({time.monotonic() - start:.0f} s)")
            reward = 0.0
            for i in range(0, len(split.train), CONCURRENCY):
                chunk = split.train[i:i + CONCURRENCY]
                reward += drive(learner, bench, chunk, pool)
                drive(control, bench, chunk, pool)
                done = i + len(chunk)
                if pace_s and done < len(split.train) and not learner.wait_settled(pace_s):
                    log(f"  seed {seed}: the learner's loop was still busy {pace_s:.0f} s after report {done}")
                if done % (CONCURRENCY * 8) == 0 or done == len(split.train):
                    loop = learner.loop_state()
                    log(f"  seed {seed}: {done}/{len(split.train)} reports, traffic reward {reward / done:.3f}, "
                        f"learner loop {loop.get('state')} after {loop.get('steps', 0)} step(s) "
                        f"({time.monotonic() - start:.0f} s)")
            settled = learner.wait_settled(bench.settle_timeout_s)
            if not settled:
                log(f"  seed {seed}: learning had not settled after {bench.settle_timeout_s:.0f} s; measuring anyway")
            after = {s.name: accuracy(s, bench, split.heldout, pool) for s in servers}
        candidates = learner.candidates()
        lineage = learner.lineage()
        log(f"  seed {seed}: held-out after: learner {after[learner.name]:.3f}, control {after[control.name]:.3f}; "
            f"candidates {dict(candidates) or 'none'} ({time.monotonic() - start:.0f} s)")
    # measured with both servers stopped, so the probe has the cores to itself
    lineage_after = lineage_accuracy(lineage, bench, split.heldout, SCENARIO) if runtime.local else None
    if lineage is not None:
        log(f"  seed {seed}: lineage at step {lineage.step} ({lineage.steps_since_publish} since the last publish), "
            f"held-out {'-' if lineage_after is None else f'{lineage_after:.3f}'}"
            f"{f'; last reset {lineage.last_reset}' if lineage.last_reset else ''} ({time.monotonic() - start:.0f} s)")
    return SeedResult(seed, control_before=before[control.name], control_after=after[control.name],
                      learner_before=before[learner.name], learner_after=after[learner.name],
                      candidates=candidates, traffic_reward=reward / max(1, len(split.train)),
                      settled=settled, seconds=time.monotonic() - start, lineage=lineage, lineage_after=lineage_after)


# ------------------------------------------------------------------ the report


def table(results: list[SeedResult]) -> str:
    """One row a seed: held-out accuracy of both servers before and after, of the learner's
    lineage head (what training reached, served or not), its steps and what the gate decided."""
    head = (f"{'seed':>4}  {'control before':>14}  {'control after':>13}  {'learner before':>14}  "
            f"{'learner after':>13}  {'lineage':>7}  {'steps':>5}  {'published':>9}  {'rejected':>8}  "
            f"{'undecided':>9}  {'other':>5}  {'wall':>7}")
    rows = [head, "-" * len(head)]
    for r in results:
        other = sum(n for status, n in r.candidates.items() if status not in ("published", "rejected", "undecided"))
        lineage = "-" if r.lineage_after is None else f"{r.lineage_after:.3f}"
        steps = "-" if r.lineage is None else str(r.lineage.step)
        rows.append(f"{r.seed:>4}  {r.control_before:>14.3f}  {r.control_after:>13.3f}  {r.learner_before:>14.3f}  "
                    f"{r.learner_after:>13.3f}  {lineage:>7}  {steps:>5}  {r.candidates.get('published', 0):>9}  "
                    f"{r.candidates.get('rejected', 0):>8}  {r.candidates.get('undecided', 0):>9}  {other:>5}  "
                    f"{r.seconds / 60:>5.1f} m" + ("" if r.settled else "  (not settled)"))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", choices=sorted({*RECIPES, *DRIVERS}))
    add_seed_options(parser)
    parser.add_argument("--budget", type=int, help="reports per seed (default: the recipe's)")
    parser.add_argument("--mode", help="a recipe mode from the registry, e.g. grpo_dis for sao")
    parser.add_argument("--endpoint", help="OpenAI-compatible base URL: run the servers with runtime=upstream")
    parser.add_argument("--model", help="the model name at --endpoint")
    parser.add_argument("--reflection-url", help="OpenAI-compatible base URL of the model a reflecting recipe "
                        "(gepa) writes with; key from $REEF_REFLECTION_API_KEY (default: the served model)")
    parser.add_argument("--reflection-model", help="the model name at --reflection-url")
    parser.add_argument("--heldout", type=int, help="held-out tasks (default: the recipe's)")
    parser.add_argument("--gate-tasks", type=int, help="gate tasks (default: the recipe's)")
    parser.add_argument("--settle-timeout", type=float, metavar="S",
                        help="seconds to wait for learning to settle after the traffic (default: the recipe's, "
                        "scaled by --budget over the recipe's budget: twice the reports, twice the steps)")
    parser.add_argument("--pace", type=float, metavar="S",
                        help="after each chunk of traffic, wait up to S seconds for the learner's loop to take "
                        "what it can (its step, gate and hot swap) before the next chunk: what it publishes then "
                        "serves the traffic that follows (default: the traffic runs back to back)")
    parser.add_argument("--gate-traffic", type=int, metavar="N", default=0,
                        help="the gate also draws up to N tasks from the learner's own scored traffic, graded by the "
                        "pattern each report carries (task_suite's traffic_tasks; never the batch being trained on), "
                        "beside its gate tasks (default: none)")
    parser.add_argument("--recipe-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe option over the registry entry's, e.g. lr=2e-4 (repeatable; the server "
                        "checks it as `reef serve` does)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DRIVERS:
        import importlib

        return importlib.import_module(DRIVERS[argv[0]]).main(argv)
    args = parser.parse_args(argv)
    seeds = chosen_seeds(args)

    # a SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so both servers of the seed are stopped
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    bench = RECIPES[args.recipe]
    overrides = {k: v for k, v in (("heldout_tasks", args.heldout), ("gate_tasks", args.gate_tasks)) if v}
    if overrides:
        bench = bench.with_sizes(**overrides)
    if args.gate_traffic < 0:
        parser.error("--gate-traffic takes a count of tasks, 0 or more")
    bench = with_gate_traffic(bench, args.gate_traffic)
    try:
        bench = with_recipe_options(bench, args.recipe_option)
    except ValueError as exc:
        parser.error(str(exc))
    reflection = reflection_model(args.reflection_url, args.reflection_model)
    try:
        bench.recipe_config(args.mode, reflection=reflection)
    except ValueError as exc:
        parser.error(str(exc))
    budget = args.budget or bench.budget
    bench = replace(bench, settle_timeout_s=args.settle_timeout or settle_timeout(bench, budget))
    runtime = Runtime.choose(args.endpoint, args.model)
    print(f"recipe {bench.name}{f' (mode {args.mode})' if args.mode else ''}: {bench.notes}"
          + (f"; options over the entry's: {', '.join(args.recipe_option)}" if args.recipe_option else ""))
    if bench.reflection_option:
        print(f"reflection model: {f'{args.reflection_model} at {args.reflection_url}' if reflection else 'the served model'}")
    print(f"runtime {runtime.description}; {describe_seeds(seeds)}, {budget} reports per seed, "
          f"traffic at temperature {bench.temperature}, {bench.gate_tasks} gate"
          f"{f' (and up to {args.gate_traffic} from the traffic)' if args.gate_traffic else ''} and "
          f"{bench.heldout_tasks} held-out tasks (greedy)"
          + (f"; paced: the learner's loop takes each chunk of {CONCURRENCY} reports (up to {args.pace:g} s) before "
             "the next" if args.pace else ""), flush=True)
    start = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="reef-bench-learning-") as tmp:
        for seed in seeds:
            results.append(run_seed(bench, seed, budget=budget, mode=args.mode, runtime=runtime, workdir=Path(tmp),
                                    log=lambda line: print(line, flush=True), reflection=reflection,
                                    pace_s=args.pace))
    print()
    print(table(results))
    heads = [r.lineage_after for r in results if r.lineage_after is not None]
    if heads:
        print(f"lineage heads (trained, served or not): held-out {sum(heads) / len(heads):.3f} on average over "
              f"{len(heads)} seed(s), beside the served {sum(r.learner_after for r in results) / len(results):.3f}")
    print(summary_line(bench.name, [r.learner_after for r in results], [r.control_after for r in results],
                       bench.heldout_tasks, (time.monotonic() - start) / 60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
