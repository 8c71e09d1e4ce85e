"""What may name a scenario: one rule for requests, routes, the CLI and the configuration.

A light module (no FastAPI): ``reef_core.config`` checks the names a configuration gives with it.
"""

from __future__ import annotations

import re

#: what a scenario name may be; ``\Z``, not ``$``: ``$`` also matches before a trailing newline
SCENARIO_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}\Z")
#: the longest a name may be with each '.' and ':' counted as the three characters of its escape
#: (``%2E``, ``%3A``): a scenario's name is a file name in the release chain's git refs, its
#: releases directory and its learner lineage, and a file name has at most 255 bytes (git adds ".lock")
MAX_ESCAPED = 250
_NAME_RULE = ("letters, digits, '_', '-', '.', ':'; at most 200 characters, and at most 250 with each '.' and ':' "
              "counted as 3")


def is_scenario_name(name: str) -> bool:
    """Whether ``name`` may name a scenario (``SCENARIO_NAME``, and ``MAX_ESCAPED`` escaped)."""
    return bool(SCENARIO_NAME.match(name)) and len(name) + 2 * (name.count(".") + name.count(":")) <= MAX_ESCAPED


def scenario_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a scenario, in one line (None: it can)."""
    return None if is_scenario_name(name) else f"{name[:80]!r} is not a valid scenario name ({_NAME_RULE})"
