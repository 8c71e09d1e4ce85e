"""The learning curve's SVG geometry on long spans (the page tests cover a run of seconds)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from reef_core.ui import chart


def test_windows_follow_the_span_of_the_reports():
    assert chart._window(timedelta(days=10))[0] == "day"
    assert chart._window(timedelta(hours=5))[0] == "hour"
    assert chart._window(timedelta(minutes=30))[0] == "minute"
    assert chart._window(timedelta(seconds=2))[0] == "10 seconds"


def test_svg_places_every_point_inside_the_plot():
    t0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
    curve = chart.Curve(
        per_release=[chart.ReleasePoint("no release", "no release", 0.2, 4, t0, t0 + timedelta(days=2)),
                     chart.ReleasePoint("rel_a", "#1", 0.8, 6, t0 + timedelta(days=2), t0 + timedelta(days=6))],
        windows=[chart.WindowPoint(t0 + timedelta(days=d), 0.1 * d, 2) for d in range(7)],
        marks=[chart.Mark("rel_a", "#1", "train", t0 + timedelta(days=2), 0.9, 0.3),
               chart.Mark("rel_b", "#2", "rollback", t0 + timedelta(days=6))])
    plot = chart.svg(curve)
    inside_x = lambda v: plot["left"] <= v <= plot["right"]  # noqa: E731
    inside_y = lambda v: plot["top"] <= v <= plot["bottom"]  # noqa: E731
    assert all(inside_x(p["cx"]) and inside_y(p["y"]) for p in plot["releases"])
    assert all(inside_x(w["x"]) and inside_y(w["y"]) for w in plot["windows"])
    assert all(inside_x(m["x"]) for m in plot["marks"])
    # a higher score is drawn higher up
    low, high = plot["releases"]
    assert high["y"] < low["y"]
    # the rollback at the right edge is labelled leftwards; days are dated on the axis
    assert plot["marks"][1]["anchor"] == "end" and plot["marks"][0]["anchor"] == "start"
    assert plot["xticks"][0]["label"] == "03-01 00:00" and len(plot["xticks"]) == 5
    assert plot["marks"][1]["cand_y"] is None and plot["marks"][0]["cand_y"] < plot["marks"][0]["cur_y"]
