"""The ``reef demo`` command (registered in ``reef_core.cli``)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click


@click.command("demo")
@click.option("--quick", is_flag=True, help="A smaller run (fewer users, rounds and questions), for tests.")
@click.option("--recipe", default="feedback_rules", show_default=True,
              help="The recipe that learns (any installed one: reef plugins lists them).")
@click.option("--users", type=click.IntRange(1, 8), help="Simulated users (default 4; 3 with --quick).")
@click.option("--port", type=click.IntRange(0, 65535), default=0,
              help="Port of the demo's server on 127.0.0.1 (default: a free one).")
@click.option("--keep-serving", is_flag=True, help="Keep the server running after the summary (Ctrl-C stops it).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("reef-demo"), show_default=True,
              help="Where the summary, the learning curve and the server's state go.")
def demo(quick: bool, recipe: str, users: int | None, port: int, keep_serving: bool, out: Path) -> None:
    """Watch Reef learn: simulated users with a hidden preference teach the embedded SmolLM2
    through the HTTP API; ends with the score before and after, the releases and a learning curve."""
    from rich.console import Console

    from ..plugins import get_plugins
    from .plot import learning_curve, matplotlib_missing
    from .run import Plan, run_demo, summary_panel, write_summary
    from .server import ServerError, free_port

    missing = matplotlib_missing()
    if missing:
        raise click.ClickException(missing)
    plugins = get_plugins()
    recipes = sorted(plugins.registry.get("recipe", {}))
    if recipe not in recipes:
        raise click.BadParameter(f"{recipe!r} is not an installed recipe; installed: {', '.join(recipes)} "
                                 "(pip install reef-recipe-<name> adds one)", param_hint="--recipe")
    if "local" not in plugins.registry.get("runtime", {}):
        raise click.ClickException("reef demo serves the embedded SmolLM2 with the local runtime: "
                                   "pip install reef-torch (scripts/setup.sh installs it)")
    # a SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the demo's server is stopped
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    console = Console()
    out.mkdir(parents=True, exist_ok=True)
    plan = Plan.choose(quick, users)
    try:
        result, server = run_demo(recipe=recipe, plan=plan, port=port or free_port(), out=out, console=console,
                                  keep=keep_serving)
    except ServerError as exc:
        raise click.ClickException(str(exc)) from None
    result.png = str(learning_curve(result, out / "learning-curve.png"))
    write_summary(result, out)
    console.print(summary_panel(result, serving=keep_serving))
    # the plain lines a script can read (summary.json has everything)
    click.echo(f"published={result.published} rejected={result.rejected} before={result.before:.3f} "
               f"after={result.after:.3f} seconds={result.seconds:.0f}")
    if keep_serving:
        click.echo(f"serving at {server.url} (dashboard {result.dashboard}); Ctrl-C stops it")
        try:
            server.wait()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
