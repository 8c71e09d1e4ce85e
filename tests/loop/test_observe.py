"""Observe: the eligibility pool and the standard record filters."""

from __future__ import annotations

import pytest

from reef_core.builtins.filters import (
    DedupFilter,
    FreshnessFilter,
    ScoredFilter,
    ScoreWindowFilter,
    SessionFilter,
)
from reef_core.errors import ConfigError
from reef_core.observe import build_filters, eligible, load_pool, parse_filter_spec
from reef_core.observe.eligibility import filter_context
from reef_core.plugins import get_plugins, instantiate
from reef_core.store import Record, RecordStore, Release, Report, new_id


@pytest.fixture
def store(store_url):
    """The filters run on SQLite and on PostgreSQL (the suite's ``store_url`` fixture)."""
    s = RecordStore(store_url)
    yield s
    s.close()


def _record(store, *, text="q", answer="a", session=None, release=None, content_hash=None, scenario="s"):
    rec = Record(id=new_id("rec"), scenario=scenario, session=session, release_id=release,
                 request={"messages": [{"role": "user", "content": text}]},
                 response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
                 content_hash=content_hash)
    store.add_record(rec)
    return rec.id


def _report(store, refs, score=None, feedback=None, scenario="s"):
    rpt = Report(id=new_id("rpt"), scenario=scenario, score=score, feedback=feedback, references=refs,
                 body_hash=new_id("h"))
    store.add_report(rpt)
    return rpt.id


def test_pool_is_unconsumed_reports_with_unconsumed_records_in_order(store):
    a, b, c = (_record(store, text=t) for t in "abc")
    r1 = _report(store, [b, a], score=0.0, feedback="fb")
    r2 = _report(store, [c], score=1.0)
    r3 = _report(store, [a], score=0.5)
    pool = load_pool(store, "s")
    assert [e.report_id for e in pool] == [r1, r2, r3]
    assert pool[0].record_ids == [b, a]
    assert pool[0].feedback_text() == "fb"
    assert pool[0].records[0].response_text() == "a"
    store.consume("cand_x", "s", record_ids=[a], report_ids=[r1])
    assert [e.report_id for e in load_pool(store, "s")] == [r2]


def test_scored_and_score_window(store):
    ids = {score: _report(store, [_record(store)], score=score) for score in (0.0, 0.5, 1.0)}
    _report(store, [_record(store)], score=None)
    pool = load_pool(store, "s")
    ctx = filter_context(store, "s")
    assert len(ScoredFilter().apply(pool, ctx)) == 3
    window = ScoreWindowFilter(min=0.25, max=0.5).apply(pool, ctx)
    assert [e.report_id for e in window] == [ids[0.5]]
    assert ScoreWindowFilter().apply(pool, ctx) == pool
    with pytest.raises(ValueError, match="above max"):
        ScoreWindowFilter(min=1, max=0)


def test_dedup_by_content_in_the_pool_and_against_consumed_records(store):
    first = _report(store, [_record(store, text="same")], score=0.0)
    _report(store, [_record(store, text="same")], score=0.0)  # same content, computed hash
    other = _report(store, [_record(store, text="other")], score=0.0)
    ctx = filter_context(store, "s")
    assert [e.report_id for e in DedupFilter().apply(load_pool(store, "s"), ctx)] == [first, other]

    old = _record(store, text="hashed", content_hash="h1")
    store.consume("cand_x", "s", record_ids=[old])
    repeat = _report(store, [_record(store, text="hashed", content_hash="h1")], score=0.0)
    kept = [e.report_id for e in DedupFilter().apply(load_pool(store, "s"), ctx)]
    assert repeat not in kept


def test_freshness_counts_releases_behind_the_head(store):
    for seq in (1, 2, 3):
        store.add_release(Release(scenario="s", sequence=seq, release_id=f"rel_{seq}", content_hash="c",
                                  operation="train"))
    by_release = {rel: _report(store, [_record(store, release=rel)], score=0.0)
                  for rel in (None, "rel_1", "rel_2", "rel_3")}
    ctx = filter_context(store, "s")
    pool = load_pool(store, "s")
    assert {e.report_id for e in FreshnessFilter(max_behind=0).apply(pool, ctx)} == {by_release["rel_3"]}
    assert {e.report_id for e in FreshnessFilter(max_behind=1).apply(pool, ctx)} == {by_release["rel_2"],
                                                                                     by_release["rel_3"]}
    assert len(FreshnessFilter(max_behind=3).apply(pool, ctx)) == 4


def test_session_assembly_attaches_the_other_turns(store):
    t1 = _record(store, text="turn 1", session="sess")
    t2 = _record(store, text="turn 2", session="sess")
    t3 = _record(store, text="turn 3", session="sess")
    lone = _record(store, text="alone")
    r = _report(store, [t3], score=0.0)
    r_lone = _report(store, [lone], score=0.0)
    ctx = filter_context(store, "s")
    out = SessionFilter().apply(load_pool(store, "s"), ctx)
    assert [e.report_id for e in out] == [r, r_lone]
    assert [x.id for x in out[0].session_records] == [t1, t2]
    assert out[0].record_ids == [t3]
    assert [e.report_id for e in SessionFilter(require=True).apply(load_pool(store, "s"), ctx)] == [r]


def _builder(**services):
    """What ``Reef.build`` does for filters: instantiate with the services they declare."""
    return lambda kind, name, options: instantiate(kind, name, options, get_plugins(), **services)


def test_filter_chain_from_recipe_and_config_declarations(store):
    filters = build_filters(["scored", ("score_window", {"max": 0.5}), {"name": "dedup"}, "scored"],
                            _builder(store=store))
    assert [n for n, _ in filters] == ["scored", "score_window", "dedup"]
    low = _report(store, [_record(store, text="x")], score=0.2)
    _report(store, [_record(store, text="y")], score=0.9)
    _report(store, [_record(store, text="x")], score=0.1)
    assert [e.report_id for e in eligible(store, "s", filters)] == [low]
    with pytest.raises(ConfigError, match="invalid record filter declaration"):
        parse_filter_spec(42)
    with pytest.raises(ConfigError, match="unknown record filter 'nope'"):
        build_filters(["nope"], _builder())


def test_ineligible_reports_never_hide_newer_eligible_ones(store, monkeypatch):
    from reef_core.observe import eligibility

    monkeypatch.setattr(eligibility, "PAGE_SIZE", 3)
    filters = build_filters(["scored", ("score_window", {"max": 0.5}), "dedup"], _builder(store=store))
    for i in range(7):
        _report(store, [_record(store, text=f"fine {i}")], score=1.0)
    first = _report(store, [_record(store, text="bad")], score=0.0)
    _report(store, [_record(store, text="bad")], score=0.0)  # a duplicate on a later page
    last = _report(store, [_record(store, text="worse")], score=0.0)
    assert [e.report_id for e in eligible(store, "s", filters)] == [first, last]
    assert [e.report_id for e in eligible(store, "s", filters, want=1)] == [first]
    assert len(load_pool(store, "s")) == 10


def test_a_pool_page_holds_a_bounded_amount_of_report_bodies(store, monkeypatch):
    """Any reporter sends bodies of megabytes: a page of the pool ends at PAGE_BYTES of them (the
    database measures them first; one larger report is a page of its own), and every report is
    still read once, in order."""
    from reef_core.observe import eligibility

    monkeypatch.setattr(eligibility, "PAGE_BYTES", 25_000)
    ids = [_report(store, [_record(store, text=f"q{i}")], score=0.0, feedback="f" * 10_000) for i in range(5)]
    pages, cursor = [], None
    while True:
        page, cursor = eligibility.load_page(store, "s", after_seq=cursor)
        pages.append([e.report_id for e in page])
        if cursor is None:
            break
    assert [len(p) for p in pages] == [2, 2, 1] and [i for p in pages for i in p] == ids
    monkeypatch.setattr(eligibility, "PAGE_BYTES", 10)
    first, cursor = eligibility.load_page(store, "s")
    assert [e.report_id for e in first] == ids[:1] and cursor is not None
