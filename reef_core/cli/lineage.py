"""``reef lineage``: a scenario's learner lineage (``reef_core.commit.lineage``), and resetting it.

The lineage lives in the state directory, so these commands read and write it there (with a
server running on it or not: a reset is a compare-and-swap the server's next step respects)."""

from __future__ import annotations

import json

import click

from .common import config_option, friendly, load_served, scenario_or_default


def _split(words: tuple[str, ...]) -> tuple[bool, str | None, tuple[str, ...]]:
    """(reset?, the scenario or None, the Hydra overrides) of ``reef lineage [reset] [SCENARIO] [key=value...]``."""
    reset = bool(words) and words[0] == "reset"
    rest = words[1:] if reset else words
    names = [w for w in rest if "=" not in w]
    if len(names) > 1:
        raise click.UsageError(f"one scenario at most, not {' '.join(names)}")
    return reset, (names[0] if names else None), tuple(w for w in rest if "=" in w)


@click.command("lineage", context_settings={"ignore_unknown_options": True})
@config_option
@click.option("--reason", default="reset by hand (reef lineage reset)", show_default=True,
              help="Why, for `reef lineage reset` (kept with the lineage).")
@click.option("--json", "as_json", is_flag=True, help="Print the lineage as JSON.")
@click.argument("words", nargs=-1, type=click.UNPROCESSED, metavar="[reset] [SCENARIO] [key=value...]")
@friendly
def lineage(config_file: str | None, reason: str, as_json: bool, words: tuple[str, ...]) -> None:
    """Show SCENARIO's learner lineage (default: server.default_scenario): its head step, the
    steps since the last publish, the last reset and why. `reef lineage reset SCENARIO` drops
    the head: the next training step starts from the serving release's state."""
    from ..commit.lineage import Lineages, describe

    reset, scenario, overrides = _split(words)
    # the state of the server started here, as `reef releases` and `reef status` read it
    settings, _plugins, _served = load_served(overrides, config_file)
    scenario = scenario_or_default(scenario, settings, None)
    if reset:
        from ..errors import StoreError

        lineages = Lineages(settings.state_dir)
        try:
            exists = lineages.head(scenario) is not None
        except StoreError:  # an unreadable head: the reset replaces it
            exists = True
        if not exists:
            click.echo(f"scenario {scenario!r} has no learner lineage: nothing to reset")
            return
        serving = settings.open_record_store()
        try:
            rows = serving.list_releases(scenario)
        finally:
            serving.close()
        head = rows[0].release_id if rows else None
        lineages.reset(scenario, to_release=head, reason=reason)
        click.echo(f"{scenario}: lineage reset; the next step trains from {head or 'the base model'}")
        return
    found = describe(settings.state_dir, scenario)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    head = found["head"]
    if head is None:
        click.echo(f"scenario {scenario!r} has no learner lineage (its recipe keeps none, or it has not trained yet)")
        return
    origin = f"checkpoint {head['id']}" if head["checkpoint"] else "the serving release's state (reset)"
    click.echo(f"{scenario}: lineage step {head['step']}, head {origin}")
    published = head["published_release"]
    click.echo(f"  steps since the last publish: {head['steps_since_publish']}"
               + (f" (release {published} at step {head['published_step']})" if published else " (none published)"))
    meta = head["meta"]
    if meta.get("lineage_lag_max") is not None:
        click.echo(f"  policy lag of the last step's rollouts: {meta['lineage_lag_mean']:.2f} lineage step(s) on "
                   f"average, {meta['lineage_lag_max']} at most")
    last = head["last_reset"]
    click.echo(f"  last reset: {last['at'][:19].replace('T', ' ')} at step {last['step']} to "
               f"{last['to_release'] or 'the base model'}: {last['reason']}" if last else "  last reset: never")


COMMANDS = (lineage,)
