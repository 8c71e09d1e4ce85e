"""A scenario's learning curve, computed from the store and drawn as a server-side SVG.

What is plotted:

- **feedback per release**: the mean score of the reports quoting records each release served
  (a report counts for the release that served the first record it quotes; records served
  before any release count under "no release"), drawn as a segment over the time the release's
  reports span, with a point at its mean;
- **feedback per window**: the mean report score per time window (a day, or an hour or a
  minute when the reports span less than a few days or hours);
- **evaluation**: the candidate's and the serving release's mean evaluation score of the
  candidate that each trained release came from, at the time it was published;
- **releases and rollbacks**: vertical marks on the time axis.

Every point carries its numbers in ``data-*`` attributes, and the page lists them in a table
under the chart too.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from ..store.recordstore import RecordStore

NO_RELEASE = "no release"
#: the newest scored reports a curve is drawn from (each one three small columns)
CURVE_REPORTS = 50_000

WIDTH, HEIGHT = 860, 320
LEFT, RIGHT, TOP, BOTTOM = 56, 20, 24, 44
#: release labels above the plot: an 11px label's width per character (generous, so that two
#: labels estimated apart never touch), the gap kept between two labels on one row, the height of
#: a row, and the rows stacked at most (a label that fits on none is left out; its line's
#: tooltip and the table under the chart still name it)
LABEL_CHAR_W, LABEL_GAP, LABEL_ROW_H, LABEL_ROWS = 7.0, 6.0, 13, 3


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


@dataclass
class ReleasePoint:
    release: str
    label: str
    mean: float
    n: int
    first: datetime
    last: datetime


@dataclass
class WindowPoint:
    start: datetime
    mean: float
    n: int


@dataclass
class Mark:
    release: str
    label: str
    operation: str
    at: datetime
    candidate_mean: float | None = None
    current_mean: float | None = None


@dataclass
class Curve:
    per_release: list[ReleasePoint] = field(default_factory=list)
    windows: list[WindowPoint] = field(default_factory=list)
    window: str = "day"
    marks: list[Mark] = field(default_factory=list)
    reports: int = 0

    @property
    def empty(self) -> bool:
        return not (self.per_release or self.marks)


#: window sizes, largest first: the largest that still cuts the reports' span into 3 or more
_WINDOWS = (("day", timedelta(days=1)), ("hour", timedelta(hours=1)), ("minute", timedelta(minutes=1)),
            ("10 seconds", timedelta(seconds=10)))


def _window(span: timedelta) -> tuple[str, timedelta]:
    for name, size in _WINDOWS:
        if span >= 3 * size:
            return name, size
    return _WINDOWS[-1]


def _floor(at: datetime, size: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    return epoch + ((at - epoch) // size) * size


def learning_curve(store: RecordStore, scenario: str, releases: list[Any]) -> Curve:
    """The curve of ``scenario`` (blocking: reads the store); ``releases`` as the release chain
    lists them (any order)."""
    # three columns of the newest CURVE_REPORTS scored reports: no feedback or metadata is read
    scored = store.scored_report_points(scenario, limit=CURVE_REPORTS)
    served_by = store.record_release_ids(ref for _, _, ref in scored)  # two columns: no record bodies are read
    labels = {r.release_id: f"#{r.sequence}" for r in releases}
    by_release: dict[str, list[tuple[datetime, float]]] = defaultdict(list)
    for created_at, score, ref in scored:
        if ref not in served_by:
            continue
        by_release[served_by[ref] or NO_RELEASE].append((_utc(created_at), float(score)))
    curve = Curve(reports=sum(len(v) for v in by_release.values()))
    for release, items in by_release.items():
        times = [t for t, _ in items]
        curve.per_release.append(ReleasePoint(
            release=release, label=labels.get(release, release if release == NO_RELEASE else release[:12]),
            mean=_mean([s for _, s in items]), n=len(items), first=min(times), last=max(times)))
    curve.per_release.sort(key=lambda p: p.first)
    everything = sorted(item for items in by_release.values() for item in items)
    if everything:
        curve.window, size = _window(everything[-1][0] - everything[0][0])
        buckets: dict[datetime, list[float]] = defaultdict(list)
        for at, score in everything:
            buckets[_floor(at, size)].append(score)
        curve.windows = [WindowPoint(start=k, mean=_mean(v), n=len(v)) for k, v in sorted(buckets.items())]
    for r in sorted(releases, key=lambda r: r.sequence):
        ev = r.evaluation or {}
        curve.marks.append(Mark(release=r.release_id, label=f"#{r.sequence}", operation=r.operation,
                                at=_utc(r.created_at), candidate_mean=_float(ev.get("candidate_mean")),
                                current_mean=_float(ev.get("current_mean"))))
    return curve


def _mean(values: list[float]) -> float:
    """The mean of finite scores, finite however large they are (a plain sum of two scores of
    1e308 overflows: reports take any finite score)."""
    n = len(values)
    return sum(v / n for v in values)


def _float(value: Any) -> float | None:
    value = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return value if value is not None and math.isfinite(value) else None


# ---------------------------------------------------------------------------- SVG


def svg(curve: Curve) -> dict[str, Any]:
    """Everything the chart template draws, in pixel coordinates."""
    times = [p.first for p in curve.per_release] + [p.last for p in curve.per_release] + [m.at for m in curve.marks]
    t0, t1 = min(times), max(times)
    if t1 <= t0:
        t0, t1 = t0 - timedelta(minutes=1), t1 + timedelta(minutes=1)
    values = [p.mean for p in curve.per_release] + [w.mean for w in curve.windows]
    values += [v for m in curve.marks for v in (m.candidate_mean, m.current_mean) if v is not None]
    lo, hi = min([0.0, *values]), max([1.0, *values])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    span = (t1 - t0).total_seconds()
    stamp = "%m-%d %H:%M" if span >= 3 * 3600 else "%H:%M:%S"

    def x(at: datetime) -> float:
        return round(LEFT + plot_w * (at - t0).total_seconds() / span, 2)

    labels = place_labels([x(m.at) for m in curve.marks], [mark_text(m) for m in curve.marks])
    # the rows of labels sit above the plot: each row past the first makes the chart that much taller
    extra = LABEL_ROW_H * (max((lb["row"] for lb in labels if lb["row"] is not None), default=0))
    top, height = TOP + extra, HEIGHT + extra

    # halves: the span of scores near the float limits (1e308 and -1e308) does not overflow
    half_span = hi / 2 - lo / 2

    def y(value: float) -> float:
        return round(top + plot_h * (1 - (value / 2 - lo / 2) / half_span), 2)

    ticks = [lo * (1 - i / 4) + hi * (i / 4) for i in range(5)]
    return {
        "width": WIDTH, "height": height, "left": LEFT, "right": WIDTH - RIGHT, "top": top,
        "bottom": height - BOTTOM,
        "yticks": [{"y": y(v), "label": f"{v:.2f}"} for v in ticks],
        "xticks": _xticks(t0, t1, x, stamp),
        "releases": [{"x1": x(p.first), "x2": max(x(p.last), x(p.first) + 4), "cx": x(p.first + (p.last - p.first) / 2),
                      "y": y(p.mean), "point": p} for p in curve.per_release],
        # a window starts at or before its first report: drawn from where the axis starts
        "windows": [{"x": x(max(w.start, t0)), "y": y(w.mean), "point": w} for w in curve.windows],
        "marks": [{"x": x(m.at), "mark": m, "text": mark_text(m), "anchor": lb["anchor"], "label_x": lb["x"],
                   "label_y": None if lb["row"] is None else top - 6 - LABEL_ROW_H * lb["row"],
                   "cand_y": y(m.candidate_mean) if m.candidate_mean is not None else None,
                   "cur_y": y(m.current_mean) if m.current_mean is not None else None}
                  for m, lb in zip(curve.marks, labels)],
    }


def mark_text(mark: Mark) -> str:
    """A release mark's label: ``#3``, ``#4 rollback``."""
    return f"{mark.label} rollback" if mark.operation == "rollback" else mark.label


def label_extent(x: float, anchor: str, text: str) -> tuple[float, float]:
    """Where a label written at ``x`` with ``anchor`` spans, at most (``LABEL_CHAR_W``)."""
    width = LABEL_CHAR_W * len(text)
    return (x, x + width) if anchor == "start" else (x - width, x)


def place_labels(xs: list[float], texts: list[str]) -> list[dict[str, Any]]:
    """Each mark's label, ``{"anchor", "x", "row"}``, so that no two labels overlap: written
    rightwards of its line (leftwards when it would leave the chart), on the lowest row where it
    clears the labels already there, by ``LABEL_GAP``; ``row`` None when none of ``LABEL_ROWS``
    has room. Releases published close together ("#2 rollback" and "#3 rollback" a minute apart
    on a chart of days) so stack instead of printing over each other."""
    placed: list[dict[str, Any]] = [{} for _ in xs]
    row_ends: list[float] = []  # the right end of the last label placed on each row
    for i in sorted(range(len(xs)), key=lambda i: xs[i]):
        text = texts[i]
        sides = [{"anchor": "start", "x": xs[i] + 3}, {"anchor": "end", "x": xs[i] - 3}]
        # on the chart: rightwards unless it would run off the right edge (then leftwards)
        sides = [o for o in sides if 0 <= label_extent(o["x"], o["anchor"], text)[0]
                 and label_extent(o["x"], o["anchor"], text)[1] <= WIDTH] or sides[1:]
        placed[i] = {**sides[0], "row": None}
        for row in range(LABEL_ROWS):
            free = row_ends[row] + LABEL_GAP if row < len(row_ends) else float("-inf")
            side = next((o for o in sides if label_extent(o["x"], o["anchor"], text)[0] >= free), None)
            if side is None:
                continue
            placed[i] = {**side, "row": row}
            right = label_extent(side["x"], side["anchor"], text)[1]
            row_ends[row:row + 1] = [right]
            break
    return placed


def _xticks(t0: datetime, t1: datetime, x: Any, stamp: str) -> list[dict[str, Any]]:
    """Five ticks along the time axis; a tick whose label repeats the previous one is left out."""
    ticks, last = [], None
    for i in range(5):
        at = t0 + (t1 - t0) * i / 4
        label = at.strftime(stamp)
        if label != last:
            ticks.append({"x": x(at), "label": label, "anchor": "start" if i == 0 else "end" if i == 4 else "middle"})
        last = label
    return ticks
