"""``python -m reef_recipe_tttd`` (also ``reef-tttd``): run a TTT-Discover search against a Reef server.

    python -m reef_recipe_tttd run circles3 --url http://127.0.0.1:8900 --steps 20 --groups 2 --rollouts 8
    python -m reef_recipe_tttd run spread5 --guidance --executor keywords ...
    python -m reef_recipe_tttd tasks

The server must serve ``recipe=tttd`` with the same grid (``recipe.groups_per_step``,
``recipe.rollouts_per_group``) and its loop enabled. The token comes from ``$REEF_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .harness import SearchHarness, SearchSettings, StepAborted, StepFailed
from .judge import Judge, Limits
from .persist import IdentityMismatch
from .tasks import SHIPPED, load_task


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m reef_recipe_tttd", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run search steps (resumes from the run directory)")
    run.add_argument("task", help="circles<k>, circles<k>-program, spread<n>, or module:attr of your Task")
    run.add_argument("--url", default=os.environ.get("REEF_URL", "http://127.0.0.1:8900"))
    run.add_argument("--scenario", default="default")
    run.add_argument("--model", default=None, help="the served model name (default: the first /v1/models lists)")
    run.add_argument("--run-dir", default="tttd-run", help="where the archive is kept (default: ./tttd-run)")
    run.add_argument("--steps", type=int, default=1, help="steps to have committed in the run directory")
    run.add_argument("--groups", type=int, default=8, help="G: parents per step (recipe.groups_per_step)")
    run.add_argument("--rollouts", type=int, default=64, help="R: attempts per parent (recipe.rollouts_per_group)")
    run.add_argument("--c", type=float, default=1.0, help="PUCT exploration constant")
    run.add_argument("--temperature", type=float, default=1.0)
    run.add_argument("--top-p", type=float, default=1.0)
    run.add_argument("--max-tokens", type=int, default=None)
    run.add_argument("--concurrency", type=int, default=8)
    run.add_argument("--judge-timeout", type=float, default=10.0, help="wall seconds per program (program tasks)")
    run.add_argument("--guidance", action="store_true", help="Guidance-TTT: the served model is the guide")
    run.add_argument("--executor", default="keywords", help="Guidance-TTT executor: a registered name or module:attr")
    run.add_argument("--executor-url", default=None, help="Guidance-TTT: an OpenAI-compatible executor endpoint")
    run.add_argument("--executor-model", default=None)
    sub.add_parser("tasks", help="list the shipped task families")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "tasks":
        for pattern, make in SHIPPED.items():
            shown = pattern.replace(r"(\d+)", "<k>")
            print(f"{shown}: {make(3).instruction}")
        return 0
    from .client import ReefClient

    task = load_task(args.task)
    judge = Judge(task, Limits(wall_s=args.judge_timeout, cpu_s=max(1, int(args.judge_timeout))))
    client = ReefClient(args.url, token=os.environ.get("REEF_TOKEN"), scenario=args.scenario, model=args.model)
    attempt = None
    if args.guidance:
        from .guidance import GuidanceAttempt, OpenAIExecutor, load_executor

        if args.executor_url:
            if not args.executor_model:
                print("Error: --executor-url needs --executor-model", file=sys.stderr)
                return 2
            executor = OpenAIExecutor(args.executor_url, args.executor_model, os.environ.get("REEF_EXECUTOR_API_KEY"))
        else:
            executor = load_executor(args.executor)
        attempt = GuidanceAttempt(task, executor, judge)
    settings = SearchSettings(groups=args.groups, rollouts=args.rollouts, c=args.c, temperature=args.temperature,
                              top_p=args.top_p, max_tokens=args.max_tokens, concurrency=args.concurrency)
    try:
        harness = SearchHarness(task, client, args.run_dir, settings, attempt=attempt or _direct(task, judge),
                                log=lambda m: print(m, file=sys.stderr))
        harness.run(args.steps)
    except (IdentityMismatch, StepFailed, StepAborted) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    best = harness.best()
    print(json.dumps({"best": best.value if best else None, "solution": best.solution if best else None,
                      "steps": len(harness.history), "history": harness.history}, indent=1))
    return 0


def _direct(task, judge):
    from .harness import DirectAttempt

    return DirectAttempt(task, judge)
