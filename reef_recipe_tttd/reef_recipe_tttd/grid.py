"""The grid contract and its barrier (the recipe's grouped processor).

Every rollout of one step is reported at a coordinate of a G×R grid: its report's ``metadata``
carries ``step`` (≥ 0), ``group`` (< ``groups_per_step``), ``rollout`` (< ``rollouts_per_group``),
``groups_per_step``, ``rollouts_per_group`` and ``comparison_set`` = ``tttd-step-<s>-group-<g>``;
optionally ``algorithm`` (``tttd`` or ``ttt-discover``) and ``run`` (so two searches can share a
scenario). A step trains only once all G×R coordinates are in (the barrier), and never on a grid
whose records were served by more than one release. After the barrier, groups whose rewards are
all equal teach nothing and are removed; if every group is constant one is kept (a zero-signal
step still advances the release chain the search harness waits on).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from reef_core import Experience, RecordFilter

log = logging.getLogger("reef.recipe.tttd")

ALGORITHMS = ("tttd", "ttt-discover")


class GridError(ValueError):
    """A batch that breaks the grid contract (a mixed-release or incomplete grid)."""


@dataclass(frozen=True)
class Coordinate:
    run: str
    step: int
    group: int
    rollout: int
    groups_per_step: int
    rollouts_per_group: int


def coordinate_of(metadata: dict[str, Any]) -> Coordinate | str:
    """The report's grid coordinate, or a sentence saying what is wrong with its metadata."""
    try:
        values = {k: metadata[k] for k in ("step", "group", "rollout", "groups_per_step", "rollouts_per_group")}
    except (KeyError, TypeError) as exc:
        return f"metadata lacks {exc}"
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values.values()):
        return "step, group, rollout, groups_per_step and rollouts_per_group must be integers"
    c = Coordinate(run=str(metadata.get("run") or ""), **values)
    if c.step < 0 or not 0 <= c.group < c.groups_per_step or not 0 <= c.rollout < c.rollouts_per_group:
        return f"coordinate ({c.step}, {c.group}, {c.rollout}) is outside the grid"
    if c.rollouts_per_group < 2:
        return "rollouts_per_group must be 2 or more"
    if metadata.get("comparison_set") != f"tttd-step-{c.step}-group-{c.group}":
        return f"comparison_set must be 'tttd-step-{c.step}-group-{c.group}'"
    algorithm = metadata.get("algorithm")
    if algorithm is not None and algorithm not in ALGORITHMS:
        return f"algorithm must be one of {ALGORITHMS}, not {algorithm!r}"
    return c


@dataclass
class Grid:
    """The reports of one step, by coordinate."""

    run: str
    step: int
    groups: int
    rollouts: int
    cells: dict[tuple[int, int], Experience] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.cells) == self.groups * self.rollouts

    def releases(self) -> set[str | None]:
        return {r.release_id for e in self.cells.values() for r in e.records}

    def ordered(self) -> list[Experience]:
        return [self.cells[k] for k in sorted(self.cells)]

    def group_rewards(self) -> list[list[float]]:
        return [[float(self.cells[(g, r)].score) for r in range(self.rollouts)] for g in range(self.groups)]


def assemble(items: list[Experience], groups: int | None = None, rollouts: int | None = None
             ) -> tuple[list[Grid], dict[str, int]]:
    """Group ``items`` into grids (in the order their first report arrived) and count what was
    left out: ``malformed`` metadata, a grid shape other than ``groups``×``rollouts`` (when set),
    a ``duplicate`` coordinate (the first report of a coordinate wins)."""
    grids: dict[tuple[str, int], Grid] = {}
    dropped = {"malformed": 0, "shape": 0, "duplicate": 0, "unscored": 0}
    for e in items:
        c = coordinate_of(e.metadata or {})
        if isinstance(c, str):
            dropped["malformed"] += 1
            continue
        if e.score is None or isinstance(e.score, bool) or not math.isfinite(e.score):
            dropped["unscored"] += 1
            continue
        if (groups is not None and c.groups_per_step != groups) or (rollouts is not None and c.rollouts_per_group != rollouts):
            dropped["shape"] += 1
            continue
        grid = grids.setdefault((c.run, c.step), Grid(c.run, c.step, c.groups_per_step, c.rollouts_per_group))
        if (grid.groups, grid.rollouts) != (c.groups_per_step, c.rollouts_per_group):
            dropped["shape"] += 1
            continue
        if (c.group, c.rollout) in grid.cells:
            dropped["duplicate"] += 1
            continue
        grid.cells[(c.group, c.rollout)] = e
    return list(grids.values()), dropped


def barrier(items: list[Experience], groups: int, rollouts: int) -> Grid:
    """The one complete, single-release grid ``items`` must be; ``GridError`` otherwise."""
    grids, dropped = assemble(items, groups, rollouts)
    if len(grids) != 1:
        raise GridError(f"a step trains on exactly one grid; this batch holds {len(grids)} "
                        f"(left out: {dropped})")
    grid = grids[0]
    if not grid.complete:
        raise GridError(f"grid of step {grid.step} has {len(grid.cells)} of {groups * rollouts} coordinates")
    if len(grid.releases()) > 1:
        raise GridError(f"grid of step {grid.step} mixes releases {sorted(map(str, grid.releases()))}: "
                        "every rollout of a step must come from one release")
    return grid


def informative_groups(rewards: list[list[float]]) -> tuple[list[int], int]:
    """Indices of the groups to train on and how many constant groups were removed; when every
    group is constant the first is kept (a zero-signal step)."""
    keep = [g for g, rs in enumerate(rewards) if len(rs) and max(rs) != min(rs)]
    if not keep and rewards:
        return [0], len(rewards) - 1
    return keep, len(rewards) - len(keep)


class GridFilter(RecordFilter):
    """``tttd_grid``: keeps the reports of complete, single-release G×R grids, oldest grid
    first, so the loop's batch (G×R) is exactly one step. Incomplete grids wait; a grid that
    mixes releases is rejected (never trained) and logged."""

    def __init__(self, groups_per_step: int = 8, rollouts_per_group: int = 64):
        if groups_per_step < 1 or rollouts_per_group < 2:
            raise ValueError("tttd_grid: groups_per_step must be 1 or more and rollouts_per_group 2 or more")
        self.groups = int(groups_per_step)
        self.rollouts = int(rollouts_per_group)
        self._warned: set[tuple[str, int]] = set()

    def apply(self, items: list[Experience], ctx: Any) -> list[Experience]:
        grids, _ = assemble(items, self.groups, self.rollouts)
        out: list[Experience] = []
        for grid in grids:
            if not grid.complete:
                continue
            if len(grid.releases()) > 1:
                if (grid.run, grid.step) not in self._warned:
                    self._warned.add((grid.run, grid.step))
                    log.warning("tttd: grid of step %d (run %r) mixes releases %s; it is rejected and will not train",
                                grid.step, grid.run, sorted(map(str, grid.releases())))
                continue
            out.extend(grid.ordered())
        return out
