"""The learning curve's SVG geometry on long spans (the page tests cover a run of seconds)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_scores_near_the_float_limits_draw_a_finite_chart(tmp_path):
    """Reports take any finite score: means and the axis stay finite with 1.7e308 and -1.7e308."""
    import math

    from reef_core.store import Record, RecordStore, Report

    store = RecordStore(f"sqlite:///{tmp_path / 'r.db'}")
    store.add_records([Record(id="rec_1", scenario="s", request={})])
    for i, score in enumerate((1.7e308, 1.7e308, -1.7e308)):
        store.add_report(Report(id=f"r{i}", scenario="s", score=score, references=["rec_1"], body_hash=f"h{i}"))
    curve = chart.learning_curve(store, "s", [])
    assert curve.reports == 3 and math.isclose(curve.per_release[0].mean, 1.7e308 / 3)
    plot = chart.svg(curve)
    numbers = [p["y"] for p in plot["releases"]] + [w["y"] for w in plot["windows"]] + [t["y"] for t in plot["yticks"]]
    assert all(math.isfinite(v) for v in numbers) and all("nan" not in t["label"] for t in plot["yticks"])
    assert plot["yticks"][-1]["label"] == f"{1.7e308 / 3:.2f}" and plot["yticks"][0]["label"] == "0.00"
    store.close()


def _marks(t0: datetime, offsets_s: list[int], rollbacks: list[bool]) -> list[chart.Mark]:
    return [chart.Mark(f"rel_{i}", f"#{i + 1}", "rollback" if rb else "train", t0 + timedelta(seconds=s))
            for i, (s, rb) in enumerate(zip(offsets_s, rollbacks))]


def _labels(plot: dict) -> list[tuple[float, float, float]]:
    """(left, right, y) of every label drawn, as the chart estimates their width."""
    return [(*chart.label_extent(m["label_x"], m["anchor"], m["text"]), m["label_y"])
            for m in plot["marks"] if m["label_y"] is not None]


def _assert_labels_apart(plot: dict) -> None:
    labels = _labels(plot)
    for i, (left, right, y) in enumerate(labels):
        assert 0 <= left and right <= plot["width"] and 0 < y < plot["top"]
        for other_left, other_right, other_y in labels[i + 1:]:
            if y == other_y:
                assert right + chart.LABEL_GAP <= other_left or other_right + chart.LABEL_GAP <= left


def test_rollbacks_a_minute_apart_on_a_chart_of_days_are_labelled_apart():
    t0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
    days = 4 * 86400
    curve = chart.Curve(per_release=[chart.ReleasePoint("rel_0", "#1", 0.5, 3, t0, t0 + timedelta(seconds=days))],
                        marks=_marks(t0, [0, days // 2, days // 2 + 60, days], [False, True, True, False]))
    plot = chart.svg(curve)
    two, three = plot["marks"][1], plot["marks"][2]
    assert two["text"] == "#2 rollback" and three["text"] == "#3 rollback"
    assert abs(two["x"] - three["x"]) < 1  # the lines nearly coincide…
    assert two["label_y"] != three["label_y"]  # …so the labels are stacked
    assert all(m["label_y"] is not None for m in plot["marks"])
    _assert_labels_apart(plot)
    # the plot moves down by the rows added above it, and keeps its height
    assert plot["bottom"] - plot["top"] == chart.HEIGHT - chart.TOP - chart.BOTTOM
    assert all(plot["top"] <= p["y"] <= plot["bottom"] for p in plot["releases"])


@settings(max_examples=200, deadline=None)
@given(offsets=st.lists(st.integers(0, 10 * 86400), min_size=1, max_size=30),
       rollbacks=st.lists(st.booleans(), min_size=30, max_size=30))
def test_release_labels_never_overlap_and_stay_on_the_chart(offsets, rollbacks):
    t0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
    marks = _marks(t0, offsets, rollbacks)
    plot = chart.svg(chart.Curve(marks=marks))
    _assert_labels_apart(plot)
    for m in plot["marks"]:
        assert m["label_x"] == (m["x"] + 3 if m["anchor"] == "start" else m["x"] - 3)  # next to its line
    if len(marks) <= chart.LABEL_ROWS:  # a row of its own for each: every release is labelled
        assert all(m["label_y"] is not None for m in plot["marks"])
