"""The learning bench for test-time discovery (``tttd``): one problem, many attempts, the best found.

Per seed, two real ``reef serve`` processes with ``recipe=tttd``: the LEARNER (``variant: tttd``,
its loop trains the served model's LoRA once per grid and hot-swaps it) and the floor
(``variant: search-only``: the same grids are reported and consumed, the weights stay frozen).
The package's search harness (``reef_recipe_tttd.SearchHarness``) is the client of each, with
the same seed, the same task, the same PUCT settings and the same sample budget; it talks to
Reef through the ``openai`` SDK and ``/reef/report`` only. Reported per seed: the archive's best
score at the end of the budget and the fraction of valid outputs in the first and last steps.

Usage:
    python bench/learning.py tttd [--seeds 3] [--budget 400] [--task spread2] [--groups 2]
                                  [--rollouts 8] [--lr 5e-4] [--guidance] [--model DIR] [--device cuda]
                                  [--floor-only] [--jobs 3]

``--model DIR`` serves and trains a local Hugging Face model instead of the embedded
SmolLM2-135M (which, measured, collapses onto the seed solution: see docs/recipes/tttd.md).

``--jobs N`` runs up to N seeds at once (each its own pair of servers, its log lines prefixed with
its seed): a seed's two servers leave much of 2 cores idle while they wait on each other, so 3
seeds at once take far less than 3 times one. The seeds' results do not depend on it.

``--floor-only`` runs the search-only side alone and prints its best per seed: whether a task
leaves room above what search alone finds at that budget (the fair test needs it), in minutes.

``--guidance`` runs Guidance-TTT instead: the served model is the guide and the package's
deterministic keyword executor (``keywords``) writes the solutions. The last line printed is
the summary: ``tttd: best <mean±sd> vs search-only <mean±sd> at <N> samples, valid
<first>→<last> vs <first>→<last>, <k>/<seeds> seeds above search-only, <minutes> min``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from learning_tasks import (
    add_jobs_option,
    add_seed_options,
    chosen_jobs,
    chosen_seeds,
    describe_seeds,
    fmt_mean_sd,
    run_seeds,
)

SCENARIO = "bench"
MODES = ("tttd", "search-only")


@dataclass(frozen=True)
class DiscoveryBench:
    """What one run compares: the task, the grid, the budget and the learner's options."""

    #: two numbers in [0, 1] as far apart as possible, from the seed 0.40 0.45 (0.05): a one-number
    #: edit can improve it (none of ``spread5``'s seed can) and search-only's 64 samples leave it
    #: far below the best, 1.0 (docs/recipes/tttd.md, "The task")
    task: str = "spread2"
    groups: int = 2
    rollouts: int = 8
    budget: int = 400
    lr: float = 5e-4
    lora_rank: int = 32
    kl_coef: float = 0.1
    #: the reference's sampling, both sides alike. At 0.7 SmolLM2-135M writes a valid answer
    #: more often (about one in five on spread2, one in sixteen at 1), but the learner's samples
    #: collapse onto one answer and stop improving on some seeds; at 1 they keep varying and it
    #: climbed on every seed (docs/recipes/tttd.md, "The lr and the sampling temperature")
    temperature: float = 1.0
    guidance: bool = False
    #: a local Hugging Face model directory both servers serve and the learner trains instead of
    #: the embedded SmolLM2-135M (``runtime.model``), on ``device`` (``runtime.device``)
    model: str | None = None
    device: str = "auto"
    #: the servers a seed runs: both, or the floor alone (``--floor-only``: is there room above
    #: what search-only finds, before the learner's budget is spent)
    sides: tuple[str, ...] = MODES
    #: seeds run at once (``--jobs``), each with its own servers; a bench setting, not a result's
    jobs: int = 1

    @property
    def steps(self) -> int:
        """Steps that fit the sample budget (at least one)."""
        return max(1, self.budget // (self.groups * self.rollouts))

    @property
    def samples(self) -> int:
        return self.steps * self.groups * self.rollouts


def server_config(bench: DiscoveryBench, variant: str, seed: int) -> dict[str, Any]:
    """The YAML config of one server (everything but the state dir, port and runtime)."""
    return {
        "server": {"default_scenario": SCENARIO, "log_level": "warning"},
        "recipe": {"name": "tttd", "variant": variant, "groups_per_step": bench.groups,
                   "rollouts_per_group": bench.rollouts, "lr": bench.lr, "lora_rank": bench.lora_rank,
                   "lora_alpha": bench.lora_rank, "kl_coef": bench.kl_coef, "seed": seed},
        "loop": {"enabled": True, "schedule_s": None},
    }


@dataclass
class SideResult:
    """One server's search: its history (one entry per committed step)."""

    history: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    #: the server's steps of this search: trained on a reward signal, on the KL term alone
    #: (every group constant), or skipped (nothing trained); empty when unknown
    steps: dict[str, int] = field(default_factory=dict)

    @property
    def best(self) -> float:
        return self.history[-1]["archive_best"] if self.history else 0.0

    @property
    def samples(self) -> int:
        return sum(h["samples"] for h in self.history)

    def valid(self, which: str) -> float:
        if not self.history:
            return 0.0
        return self.history[0 if which == "first" else -1]["valid_fraction"]


@dataclass
class DiscoverySeed:
    seed: int
    sides: dict[str, SideResult]
    seconds: float = 0.0

    @property
    def above(self) -> bool:
        """The learner's best beats the floor's by more than float noise: two archives that kept
        the same solution can score it 0.2 and 0.20000000000000004 (the judge recomputes it)."""
        floor = self.sides["search-only"].best
        return self.sides["tttd"].best - floor > 1e-9 * max(1.0, abs(floor))


def step_kinds(candidates: list[dict[str, Any]]) -> dict[str, int]:
    """How the server's candidates of one search trained: ``reward`` (a reward signal),
    ``kl_only`` (every group constant: the KL term alone, the step's ``tttd.metrics.kl_only``)
    or ``skipped`` (nothing trained)."""
    kinds = {"reward": 0, "kl_only": 0, "skipped": 0}
    for c in candidates:
        metrics = (((c.get("artifact") or {}).get("metadata") or {}).get("tttd") or {}).get("metrics") or {}
        if c.get("status") == "skipped":
            kinds["skipped"] += 1
        elif metrics.get("kl_only"):
            kinds["kl_only"] += 1
        elif c.get("status") in ("selected", "published"):
            kinds["reward"] += 1
    return kinds


def seed_table(results: list[DiscoverySeed]) -> str:
    rows = ["seed | tttd best | search-only best | tttd valid first→last | search-only valid first→last | "
            "tttd steps reward/KL-only/skipped | min",
            "---- | -------- | ---------------- | --------------------- | ---------------------------- | "
            "--------------------------------- | ---"]
    for r in results:
        t, s = r.sides["tttd"], r.sides["search-only"]
        kinds = "/".join(str(t.steps[k]) for k in ("reward", "kl_only", "skipped")) if t.steps else "-"
        rows.append(f"{r.seed} | {t.best:.4f} | {s.best:.4f} | {t.valid('first'):.0%}→{t.valid('last'):.0%} | "
                    f"{s.valid('first'):.0%}→{s.valid('last'):.0%} | {kinds} | {r.seconds / 60:.1f}"
                    + (f" | errors: {t.error or ''} {s.error or ''}" if t.error or s.error else ""))
    return "\n".join(rows)


def _valid_span(sides: list[SideResult]) -> str:
    return f"{statistics.fmean(s.valid('first') for s in sides):.0%}→{statistics.fmean(s.valid('last') for s in sides):.0%}"


def summary(name: str, results: list[DiscoverySeed], samples: int, minutes: float) -> str:
    """The one summary line of the run."""
    learner = [r.sides["tttd"] for r in results]
    floor = [r.sides["search-only"] for r in results]
    above = sum(r.above for r in results)
    return (f"{name}: best {fmt_mean_sd([s.best for s in learner])} vs search-only "
            f"{fmt_mean_sd([s.best for s in floor])} at {samples} samples, valid {_valid_span(learner)} vs "
            f"{_valid_span(floor)}, {above}/{len(results)} seeds above search-only, {minutes:.1f} min")


def floor_summary(task: str, results: list[DiscoverySeed], samples: int, minutes: float) -> str:
    """The summary line of ``--floor-only``: what search-only alone found on ``task``."""
    floor = [r.sides["search-only"] for r in results]
    return (f"tttd --floor-only on {task}: search-only best {fmt_mean_sd([s.best for s in floor])} at {samples} "
            f"samples (seeds: {', '.join(f'{s.best:.4f}' for s in floor)}), valid {_valid_span(floor)}, "
            f"{minutes:.1f} min")


def run_side(server: Any, bench: DiscoveryBench, seed: int, run_dir: Path, log: Callable[[str], None]) -> SideResult:
    """The search harness against one server for the whole budget."""
    from reef_recipe_tttd import GuidanceAttempt, SearchHarness, SearchSettings, keyword_executor, load_task
    from reef_recipe_tttd.client import ReefClient

    task = load_task(bench.task)
    client = ReefClient(server.url, token=server.token, scenario=SCENARIO, model=server.model)
    attempt = GuidanceAttempt(task, keyword_executor) if bench.guidance else None
    settings = SearchSettings(groups=bench.groups, rollouts=bench.rollouts, temperature=bench.temperature,
                              concurrency=8, wait_timeout_s=900, run=f"bench-{seed}")
    result = SideResult()
    try:
        harness = SearchHarness(task, client, run_dir, settings, attempt=attempt,
                                log=lambda m: log(f"  [{server.name}] {m}"))
        while harness.next_step < bench.steps:
            harness.step()
            result.history = list(harness.history)
    except Exception as exc:  # the table says which side failed and why; the other side goes on
        result.error = f"{type(exc).__name__}: {exc}"
        log(f"  [{server.name}] stopped: {result.error}\n{server.log_tail()}")
    finally:
        try:
            result.steps = step_kinds(client.candidates(limit=1000))
        except Exception:  # noqa: BLE001 - a count for the table; the search's result stands without it
            pass
        client.close()
    return result


def run_seed(bench: DiscoveryBench, seed: int, runtime: Any, workdir: Path,
             log: Callable[[str], None]) -> DiscoverySeed:
    """Both servers of one seed, searched side by side."""
    from learning import ReefProcess, serving

    start = time.monotonic()
    servers = {mode: ReefProcess(mode, workdir / f"seed{seed}", server_config(bench, mode, seed), runtime,
                                 evaluator="always") for mode in bench.sides}
    sides: dict[str, SideResult] = {}
    with serving(servers.values(), log):

        def one(mode: str) -> None:
            sides[mode] = run_side(servers[mode], bench, seed, workdir / f"seed{seed}" / f"{mode}-run", log)

        # daemon threads joined with a timeout: SIGTERM reaches the main thread, which stops both
        # servers (serving's finally) and the searches end with them
        threads = [threading.Thread(target=one, args=(m,), daemon=True) for m in bench.sides]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(1.0)
    result = DiscoverySeed(seed, {m: sides.get(m, SideResult(error="did not run")) for m in bench.sides},
                           time.monotonic() - start)
    log(f"seed {seed}: " + " vs ".join(f"{m} best {result.sides[m].best:.4f}" for m in bench.sides)
        + f" ({result.seconds / 60:.1f} min)")
    return result


def parse(argv: list[str]) -> tuple[DiscoveryBench, list[int]]:
    p = argparse.ArgumentParser(prog="bench/learning.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe", choices=["tttd"])
    add_seed_options(p)
    p.add_argument("--budget", type=int, default=DiscoveryBench.budget, help="samples per side and seed")
    p.add_argument("--task", default=DiscoveryBench.task)
    p.add_argument("--groups", type=int, default=DiscoveryBench.groups)
    p.add_argument("--rollouts", type=int, default=DiscoveryBench.rollouts)
    p.add_argument("--lr", type=float, default=DiscoveryBench.lr)
    p.add_argument("--temperature", type=float, default=DiscoveryBench.temperature)
    p.add_argument("--lora-rank", type=int, default=DiscoveryBench.lora_rank)
    p.add_argument("--guidance", action="store_true", help="Guidance-TTT with the keyword executor")
    p.add_argument("--floor-only", action="store_true",
                   help="run the search-only side alone: its best at the budget, to see that a task leaves room "
                        "above what search alone finds (minutes instead of the learner's hour)")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="a local Hugging Face model directory to serve and train instead of the embedded "
                        "SmolLM2-135M (a capable model, e.g. on a GPU machine)")
    p.add_argument("--device", default="auto", help="where that model runs: auto, cpu, cuda, cuda:1 ...")
    add_jobs_option(p)
    a = p.parse_args(argv)
    if a.model is not None and not Path(a.model).is_dir():
        raise SystemExit(f"Error: --model {a.model!r} is not a directory (a local Hugging Face model)")
    seeds = chosen_seeds(a)
    if a.budget < a.groups * a.rollouts:
        raise SystemExit("Error: --budget must be at least one grid (groups x rollouts)")
    return DiscoveryBench(task=a.task, groups=a.groups, rollouts=a.rollouts, budget=a.budget, lr=a.lr,
                          temperature=a.temperature, lora_rank=a.lora_rank, guidance=a.guidance,
                          model=a.model, device=a.device, jobs=chosen_jobs(a),
                          sides=("search-only",) if a.floor_only else MODES), seeds


def local_runtime(bench: DiscoveryBench, runtime_cls: Any) -> Any:
    """Both servers' runtime: reef-torch serving the embedded SmolLM2-135M, or ``--model``."""
    return runtime_cls.local_model(bench.model, bench.device)


def main(argv: list[str]) -> int:
    """``bench/learning.py tttd [options]``: every seed, the table, the summary line last."""
    import signal
    import sys

    from learning import Runtime, stop_live_servers

    bench, seeds = parse(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    # two servers share the machine: one torch thread each keeps their steps from thrashing
    os.environ["OMP_NUM_THREADS"] = os.environ.get("REEF_BENCH_THREADS", "1")
    os.environ["MKL_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
    runtime = local_runtime(bench, Runtime)
    log = lambda line: print(line, flush=True)  # noqa: E731
    name = "tttd (Guidance-TTT, keyword executor)" if bench.guidance else "tttd"
    log(f"{name} on {bench.task}: {bench.groups}x{bench.rollouts} grid, {bench.steps} steps = {bench.samples} samples "
        f"per side, temperature {bench.temperature:g}, lr {bench.lr:g}, LoRA rank {bench.lora_rank}; "
        f"runtime {runtime.description}; {describe_seeds(seeds)}"
        + ("; search-only alone (--floor-only)" if bench.sides != MODES else "")
        + (f"; {bench.jobs} seeds at a time" if bench.jobs > 1 else ""))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reef-bench-discovery-") as tmp:
        results = run_seeds(seeds, bench.jobs, lambda seed, seed_log: run_seed(bench, seed, runtime, Path(tmp),
                                                                               seed_log), log,
                            on_abort=stop_live_servers)
    minutes = (time.monotonic() - start) / 60
    if bench.sides != MODES:
        log(floor_summary(bench.task, results, bench.samples, minutes))
        return 0
    log("")
    log(seed_table(results))
    log(summary(name, results, bench.samples, minutes))
    return 0
