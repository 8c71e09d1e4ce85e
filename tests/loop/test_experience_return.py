"""Rejected experience returns to the pool once and only under the rule: the serving release
moved on, or enough new reports arrived; at most ``loop.max_attempts`` attempts, then it stays
consumed; no record ever trains two candidates at the same time. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from reef_core.compose import build_reef
from reef_core.errors import ConflictError
from reef_core.observe import load_pool
from reef_core.plugins import get_plugins
from reef_core.store import CandidateRow, PoolRule, Record, RecordStore, Release, Report, new_id
from reef_core.types import Candidate, Decision, Evaluation

from .conftest import add_plugin, feedback_rules_config, grow_steps, settings_for


class Down:
    """An upstream nobody listens on: these tests never call the model."""

    url, dialect = "http://127.0.0.1:9", "openai"


@pytest.fixture
def store(store_url):
    s = RecordStore(store_url)
    yield s
    s.close()


def _seed(store: RecordStore, text: str = "q", scenario: str = "s") -> tuple[str, str]:
    rec = Record(id=new_id("rec"), scenario=scenario, request={"messages": [{"role": "user", "content": text}]},
                 response={"choices": [{"message": {"content": "?"}}]})
    store.add_record(rec)
    rpt = Report(id=new_id("rpt"), scenario=scenario, score=0.0, feedback=text, references=[rec.id],
                 body_hash=new_id("h"))
    store.add_report(rpt)
    return rec.id, rpt.id


def _release(store: RecordStore, sequence: int, scenario: str = "s") -> str:
    rid = f"rel{sequence}"
    store.add_release(Release(scenario=scenario, sequence=sequence, release_id=rid, content_hash=f"h{sequence}",
                              operation="train"))
    return rid


def _attempt(store: RecordStore, rec: str, rpt: str, *, base: str | None, outcome: str = "rejected") -> str:
    """A candidate consumes (rec, rpt) on ``base`` and the gate rejects (or errors) it."""
    cid = new_id("cand")
    store.consume(cid, "s", record_ids=[rec], report_ids=[rpt])
    store.add_candidate(CandidateRow(id=cid, scenario="s", recipe="r", base_release_id=base, status="evaluating"))
    decision = "reject" if outcome == "rejected" else "error"
    store.update_candidate(cid, status=outcome, decision=decision, reason="lost", return_experience=3)
    return cid


def _pool(store: RecordStore, rule: PoolRule) -> list[str]:
    return [e.report_id for e in load_pool(store, "s", rule)]


def test_rejected_experience_returns_after_enough_new_reports(store):
    rule = PoolRule(retry_after_new=2, max_attempts=3)
    base = _release(store, 1)
    rec, rpt = _seed(store)
    _attempt(store, rec, rpt, base=base)
    assert store.consumption_states([rec, rpt]) == {rec: ("returned", 1), rpt: ("returned", 1)}
    assert store.consumed([rec, rpt]) == set()
    assert _pool(store, rule) == []
    counts = store.counts("s")
    assert counts["returned_reports"] == 1 and counts["consumed_reports"] == 0

    _, new1 = _seed(store, "one")
    assert _pool(store, rule) == [new1]  # one new report is not enough
    _, new2 = _seed(store, "two")
    assert _pool(store, rule) == [rpt, new1, new2]  # two are: back, oldest first
    assert _pool(store, PoolRule(retry_after_new=3)) == [new1, new2]


def test_rejected_experience_returns_when_the_serving_release_moves_on(store):
    rule = PoolRule(retry_after_new=100, max_attempts=3)
    rec, rpt = _seed(store)
    _attempt(store, rec, rpt, base=None, outcome="error")  # built before the first release
    assert _pool(store, rule) == []
    first = _release(store, 1)
    assert _pool(store, rule) == [rpt]

    _attempt(store, rec, rpt, base=first)
    assert _pool(store, rule) == []
    _release(store, 2)
    assert _pool(store, rule) == [rpt]
    assert store.consumption_states([rpt]) == {rpt: ("returned", 2)}


def test_after_max_attempts_experience_stays_consumed(store):
    rule = PoolRule(retry_after_new=0, max_attempts=3)
    rec, rpt = _seed(store)
    for n in (1, 2):
        _attempt(store, rec, rpt, base=None)
        assert store.consumption_states([rpt]) == {rpt: ("returned", n)}
        assert _pool(store, rule) == [rpt]
    _attempt(store, rec, rpt, base=None)
    assert store.consumption_states([rec, rpt]) == {rec: ("spent", 3), rpt: ("spent", 3)}
    assert store.consumed([rec, rpt]) == {rec, rpt}
    _release(store, 1)
    _seed(store, "new")
    assert rpt not in _pool(store, rule)
    assert store.counts("s")["exhausted_reports"] == 1
    with pytest.raises(ConflictError):
        store.consume("cand_again", "s", record_ids=[rec], report_ids=[rpt])
    # a lower max_attempts applies to experience that returned before it was lowered
    rec2, rpt2 = _seed(store, "other")
    _attempt(store, rec2, rpt2, base=None)
    assert rpt2 in _pool(store, rule) and rpt2 not in _pool(store, PoolRule(retry_after_new=0, max_attempts=1))


def test_returned_experience_is_taken_by_one_candidate_only(store):
    rule = PoolRule(retry_after_new=0)
    rec, rpt = _seed(store)
    fresh_rec, fresh_rpt = _seed(store, "fresh")
    first = _attempt(store, rec, rpt, base=None)
    store.consume("cand_a", "s", record_ids=[rec], report_ids=[rpt])
    with pytest.raises(ConflictError, match=rpt):
        store.consume("cand_b", "s", record_ids=[fresh_rec, rec], report_ids=[fresh_rpt, rpt])
    assert store.consumed([fresh_rec, fresh_rpt]) == set()  # all or nothing
    assert store.experience_of("cand_a") == {"reports": {"held": 1}, "records": {"held": 1}}
    assert store.experience_of(first) == {"reports": {}, "records": {}}
    # a proposal that failed puts it back as it was: returned after one attempt, still eligible
    assert store.release_consumption("cand_a") == 2
    assert store.consumption_states([rec, rpt]) == {rec: ("returned", 1), rpt: ("returned", 1)}
    assert _pool(store, rule) == [rpt, fresh_rpt]


def test_dedup_does_not_drop_returned_content(store):
    from reef_core.builtins.filters import DedupFilter
    from reef_core.observe.eligibility import filter_context

    rec = Record(id=new_id("rec"), scenario="s", request={"q": 1}, response={"a": 1}, content_hash="h1")
    store.add_record(rec)
    rpt = Report(id=new_id("rpt"), scenario="s", score=0.0, feedback="x", references=[rec.id], body_hash="b")
    store.add_report(rpt)
    _attempt(store, rec.id, rpt.id, base=None)
    pool = load_pool(store, "s", PoolRule(retry_after_new=0))
    assert [e.report_id for e in DedupFilter().apply(pool, filter_context(store, "s"))] == [rpt.id]


# ---------------------------------------------------------------------------- growth steps


class NewRuleRecipe:
    """Proposes a harness with one rule per feedback it has seen (always a new artifact)."""

    update_target = "harness"
    filters = ()
    default_evaluator = "always_reject"

    def __init__(self, batch_size: int = 1):
        self.batch_size = batch_size
        self.batches: list[list[str]] = []

    def propose(self, batch, current, ctx):
        self.batches.append(batch.report_ids)
        art = ctx.new_artifact()
        (art / "harness").mkdir(exist_ok=True)
        (art / "harness" / "rules.md").write_text(f"- Attempt {len(self.batches)}.\n")
        return Candidate(scenario=batch.scenario, recipe="new_rule", artifact_dir=art, summary="a rule")


class AlwaysReject:
    def evaluate(self, candidate, current, ctx):
        return Evaluation(evaluator="always_reject", candidate_scores=[0.0], current_scores=[1.0], tasks=["t"])

    def decide(self, evaluation):
        return Decision("reject", "the candidate never wins")


def _kernel(tmp_path, store_url: str, recipe: str = "new_rule", **loop: object):
    add_plugin("recipe", "new_rule", NewRuleRecipe)
    add_plugin("recipe", "failing", FailingRecipe)
    add_plugin("evaluator", "always_reject", AlwaysReject)
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always_reject"})
    config["recipe"] = {"name": recipe, "batch_size": 1}
    config["loop"].update(loop)
    config["record_store"] = {"url": store_url}
    return build_reef(settings_for(tmp_path, Down, config), get_plugins(), background=False)


def test_a_candidate_that_always_loses_stops_after_max_attempts(tmp_path, store_url):
    reef = _kernel(tmp_path, store_url, retry_after_new=0, max_attempts=3)
    rec, rpt = _seed(reef.store, scenario="default")
    steps = grow_steps(reef, 5)
    assert [s.outcome for s in steps] == ["rejected", "rejected", "rejected", "nothing", "nothing"]
    assert "no eligible experience" in steps[-1].reason
    recipe = reef.learning.plan("default").recipe
    assert recipe.batches == [[rpt]] * 3
    assert reef.store.consumption_states([rec, rpt]) == {rec: ("spent", 3), rpt: ("spent", 3)}
    assert [c.status for c in reef.store.list_candidates("default")] == ["rejected"] * 3


class FailingRecipe(NewRuleRecipe):
    """A recipe that fails on this batch (an item it cannot read, a bug)."""

    def propose(self, batch, current, ctx):
        self.batches.append(batch.report_ids)
        raise ValueError("cannot read this item")


def test_a_recipe_that_fails_on_a_batch_spends_it_after_max_attempts(tmp_path, store_url):
    """Released as if never taken, a batch the recipe fails on came back at every step and held
    the scenario's learning for good; it returns under the return rule, counting the attempt."""
    reef = _kernel(tmp_path, store_url, "failing", retry_after_new=0, max_attempts=2)
    rec, rpt = _seed(reef.store, scenario="default")
    steps = grow_steps(reef, 3)
    assert [s.outcome for s in steps] == ["error", "error", "nothing"], [s.reason for s in steps]
    assert "cannot read this item" in steps[0].reason
    assert reef.store.consumption_states([rec, rpt]) == {rec: ("spent", 2), rpt: ("spent", 2)}


def test_growth_retries_rejected_experience_once_new_reports_arrived(tmp_path, store_url):
    """The default rule: retry_after_new is the recipe's batch_size (1 here)."""
    reef = _kernel(tmp_path, store_url)
    _, first = _seed(reef.store, "first", scenario="default")
    rejected, nothing = grow_steps(reef, 2)
    assert rejected.outcome == "rejected" and nothing.outcome == "nothing"

    _, second = _seed(reef.store, "second", scenario="default")
    reef = _kernel(tmp_path, store_url)
    steps = grow_steps(reef, 3)
    assert [s.outcome for s in steps] == ["rejected", "rejected", "nothing"]
    # the returned report first (it is older), then the new one; neither comes back without news
    assert reef.learning.plan("default").recipe.batches == [[first], [second]]
    assert reef.store.consumption_states([first, second]) == {first: ("returned", 2), second: ("returned", 1)}


def test_interrupted_candidates_return_their_experience(tmp_path, store_url):
    reef = _kernel(tmp_path, store_url)
    rec, rpt = _seed(reef.store, scenario="default")
    cid = new_id("cand")
    reef.store.consume(cid, "default", record_ids=[rec], report_ids=[rpt])
    reef.store.add_candidate(CandidateRow(id=cid, scenario="default", recipe="new_rule", status="evaluating"))
    [step] = grow_steps(reef, 1)
    assert step.outcome == "nothing"  # not before the rule allows
    assert reef.store.get_candidate(cid).status == "error"
    assert reef.store.consumption_states([rpt]) == {rpt: ("returned", 1)}

    _seed(reef.store, "news", scenario="default")
    reef = _kernel(tmp_path, store_url)
    [again] = grow_steps(reef, 1)
    assert again.outcome == "rejected"
    assert reef.learning.plan("default").recipe.batches == [[rpt]]


def test_automatic_growth_stops_proposing_after_max_attempts(tmp_path):
    """With the triggers on and no wait between attempts, a loser is retried max_attempts
    times in all, then growth stops: the report is no longer eligible."""
    import time

    from reef_core.testing import ReefServer

    from .conftest import report, wait_for

    add_plugin("recipe", "new_rule", NewRuleRecipe)
    add_plugin("evaluator", "always_reject", AlwaysReject)
    config = feedback_rules_config(loop_enabled=True, evaluator={"name": "always_reject"})
    config["recipe"] = {"name": "new_rule", "batch_size": 1}
    config["loop"].update(retry_after_new=0, max_attempts=2)
    with ReefServer(tmp_path, settings=settings_for(tmp_path, Down, config)) as server:
        client = server.client()
        rec = Record(id=new_id("rec"), scenario="default", request={"q": 1})
        server.store.add_record(rec)
        rpt = report(client, [rec.id], score=0.0, feedback="f")["report_id"]

        def settled():
            loop = client.get("/reef/scenarios/default").json()["loop"]
            return loop["state"] == "idle" and loop["steps"] >= 2 and loop

        wait_for(settled, "two rejected attempts")
        time.sleep(1.0)  # the worker would have retried by now
        # idle again: a trigger's check that finds nothing to do holds the worker's lock for a
        # moment ("running"), which one read under load once caught
        loop = wait_for(settled, "the loop idle again")
        assert loop and loop["steps"] == 2 and loop["eligible"] == 0
        assert [c["status"] for c in client.get("/reef/scenarios/default/candidates").json()["candidates"]] \
            == ["rejected", "rejected"]
        counts = client.get("/reef/scenarios/default").json()["counts"]
        assert counts["exhausted_reports"] == 1 and counts["returned_reports"] == 0
        assert server.store.consumption_states([rpt]) == {rpt: ("spent", 2)}
