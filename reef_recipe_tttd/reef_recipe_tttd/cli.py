"""``reef tttd``: run a TTT-Discover search against a Reef server.

    reef tttd run circles3 --url http://127.0.0.1:8900 --steps 20 --groups 2 --rollouts 8
    reef tttd run spread5 --guidance --executor keywords ...
    reef tttd tasks

The plugin adds the group to ``reef`` (``register_commands``); ``python -m reef_recipe_tttd`` and
``reef-tttd`` run the same group on its own. The server must serve ``recipe=tttd`` with the same
grid (``recipe.groups_per_step``, ``recipe.rollouts_per_group``) and its loop enabled. The token
comes from ``$REEF_TOKEN``. This module imports click only: ``reef --help`` lists the group, and
the search harness is imported when a search runs.
"""

from __future__ import annotations

import json
import os

import click


@click.group("tttd")
def tttd() -> None:
    """TTT-Discover: search one hard problem through a Reef server that trains on every grid."""


@tttd.command("run")
@click.argument("task")
@click.option("--url", envvar="REEF_URL", default="http://127.0.0.1:8900", show_default=True, show_envvar=True,
              help="The Reef server.")
@click.option("--scenario", default="default", show_default=True)
@click.option("--model", default=None, help="The served model name (default: the first /v1/models lists).")
@click.option("--run-dir", default="tttd-run", show_default=True, help="Where the archive is kept.")
@click.option("--steps", type=int, default=1, show_default=True, help="Steps to have committed in the run directory.")
@click.option("--groups", type=int, default=8, show_default=True, help="G: parents per step (recipe.groups_per_step).")
@click.option("--rollouts", type=int, default=64, show_default=True,
              help="R: attempts per parent (recipe.rollouts_per_group).")
@click.option("--c", "c", type=float, default=1.0, show_default=True, help="PUCT exploration constant.")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--max-tokens", type=int, default=None)
@click.option("--concurrency", type=int, default=8, show_default=True)
@click.option("--judge-timeout", type=float, default=10.0, show_default=True,
              help="Wall seconds per program (program tasks).")
@click.option("--guidance", is_flag=True, help="Guidance-TTT: the served model is the guide.")
@click.option("--executor", default="keywords", show_default=True,
              help="Guidance-TTT executor: a registered name or module:attr.")
@click.option("--executor-url", default=None, help="Guidance-TTT: an OpenAI-compatible executor endpoint.")
@click.option("--executor-model", default=None)
def run(task: str, url: str, scenario: str, model: str | None, run_dir: str, steps: int, groups: int, rollouts: int,
        c: float, temperature: float, top_p: float, max_tokens: int | None, concurrency: int, judge_timeout: float,
        guidance: bool, executor: str, executor_url: str | None, executor_model: str | None) -> None:
    """Run search steps on TASK (circles<k>, circles<k>-program, spread<n>, or module:attr of your
    Task); resumes from the run directory. Prints the best solution and the history as JSON."""
    import httpx

    from .client import ReefClient
    from .harness import DirectAttempt, SearchHarness, SearchSettings, StepAborted, StepFailed
    from .judge import Judge, Limits
    from .persist import IdentityMismatch
    from .tasks import load_task

    try:
        the_task = load_task(task)
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(str(exc), param_hint="TASK") from None
    judge = Judge(the_task, Limits(wall_s=judge_timeout, cpu_s=max(1, int(judge_timeout))))
    attempt = DirectAttempt(the_task, judge)
    if guidance:
        from .guidance import GuidanceAttempt, OpenAIExecutor, load_executor

        if executor_url:
            if not executor_model:
                raise click.UsageError("--executor-url needs --executor-model")
            chosen = OpenAIExecutor(executor_url, executor_model, os.environ.get("REEF_EXECUTOR_API_KEY"))
        else:
            try:
                chosen = load_executor(executor)
            except (ValueError, ImportError, AttributeError) as exc:
                raise click.BadParameter(str(exc), param_hint="--executor") from None
        attempt = GuidanceAttempt(the_task, chosen, judge)
    settings = SearchSettings(groups=groups, rollouts=rollouts, c=c, temperature=temperature, top_p=top_p,
                              max_tokens=max_tokens, concurrency=concurrency)
    client = ReefClient(url, token=os.environ.get("REEF_TOKEN"), scenario=scenario, model=model)
    try:
        harness = SearchHarness(the_task, client, run_dir, settings, attempt=attempt,
                                log=lambda m: click.echo(m, err=True))
        harness.run(steps)
    except (IdentityMismatch, StepFailed, StepAborted) as exc:
        raise click.ClickException(str(exc)) from None
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the Reef server at {url}: {type(exc).__name__}: {exc}") from None
    finally:
        client.close()
    best = harness.best()
    click.echo(json.dumps({"best": best.value if best else None, "solution": best.solution if best else None,
                           "steps": len(harness.history), "history": harness.history}, indent=1))


@tttd.command("tasks")
def tasks() -> None:
    """List the shipped task families."""
    from .tasks import SHIPPED

    for pattern, make in SHIPPED.items():
        shown = pattern.replace(r"(\d+)", "<k>")
        click.echo(f"{shown}: {make(3).instruction}")


#: ``reef-tttd`` and ``python -m reef_recipe_tttd``: the group on its own
main = tttd
