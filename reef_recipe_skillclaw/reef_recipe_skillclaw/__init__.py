"""reef-recipe-skillclaw: a day of agent work grows and edits the harness skill pool overnight.

SkillClaw (arXiv 2604.08377) without touching weights: each task's report and the recorded
traffic of its session become a digest; a night of evolver calls summarises, judges the
unscored, groups by skill and decides per group to improve a skill, sharpen its description,
create a new one or skip; the pool diff is one composite harness candidate, gated like any other.

Hooks: the ``skillclaw`` recipe and the config group ``recipe/skillclaw.yaml``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from reef_core import hookimpl
from reef_core.kit import lazy_exports

# Each name imports its module on first use: every ``reef`` command loads this plugin.
__getattr__ = lazy_exports(__name__, {
    ".digest": ("NO_SKILL", "SessionDigest", "build_digest", "group_by_skill"),
    ".evolver": ("EndpointEvolver", "Evolver", "EvolverError", "RetryingEvolver", "RuntimeEvolver", "parse_json"),
    ".night": ("Night", "NightResult", "load_prompts"),
    ".pool": ("Skill", "SkillPool"),
    ".recipe": ("SkillClawRecipe",),
})

RECIPE = "skillclaw"

__all__ = ["NO_SKILL", "EndpointEvolver", "Evolver", "EvolverError", "Night", "NightResult", "RetryingEvolver",
           "RuntimeEvolver", "SessionDigest", "Skill", "SkillClawRecipe", "SkillPool", "build_digest",
           "group_by_skill", "load_prompts", "parse_json"]


@hookimpl
def register_recipes(register: Any) -> None:
    register(RECIPE, f"{__name__}.recipe:SkillClawRecipe")


@hookimpl
def reef_config_dir() -> str:
    return os.fspath(Path(__file__).with_name("conf"))
