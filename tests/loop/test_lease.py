"""Growth leases on SQLite and PostgreSQL: acquire, renew, expire, take over, fence."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import time

import pytest

from reef_core.compose import build_reef
from reef_core.grow.lease import Leases, holder_is_dead, host_id, late_renewal, orphans_of, settle_orphans
from reef_core.plugins import get_plugins
from reef_core.store import CandidateRow, LeaseLost, Record, RecordStore, Report, new_id
from reef_core.types import Candidate

from .conftest import add_plugin, feedback_rules_config, grow_steps, settings_for


@pytest.fixture
def store(store_url):
    s = RecordStore(store_url)
    yield s
    s.close()


def test_one_holder_at_a_time_and_tokens_grow(store):
    a, b = "h:1:a", "h:2:b"
    first = store.acquire_lease("s", a, 30)
    assert first == 1
    assert store.acquire_lease("s", b, 30) is None
    assert store.acquire_lease("s", a, 30) is None  # not re-entrant either
    assert store.acquire_lease("other", b, 30) == 1  # leases are per scenario
    assert store.release_lease("s", a, first)
    second = store.acquire_lease("s", b, 30)
    assert second == first + 1
    lease = store.get_lease("s")
    assert (lease.holder, lease.token) == (b, second)
    assert not store.release_lease("s", a, first)  # an old holding releases nothing
    assert store.get_lease("s").holder == b


def test_renew_keeps_it_expiry_loses_it_for_good(store):
    token = store.acquire_lease("s", "h:1:a", 1.5)
    assert store.renew_lease("s", "h:1:a", token, 1.5)
    time.sleep(1.7)
    assert not store.renew_lease("s", "h:1:a", token, 30)  # expired: renewal cannot revive it
    taken = store.acquire_lease("s", "h:2:b", 30)
    assert taken == token + 1
    assert not store.renew_lease("s", "h:1:a", token, 30)
    assert store.renew_lease("s", "h:2:b", taken, 30)


def test_fenced_blocks_a_stale_token(store):
    token = store.acquire_lease("s", "h:1:a", 1)
    with store.fenced("s", "h:1:a", token):
        pass
    time.sleep(1.2)
    with pytest.raises(LeaseLost, match="expired"), store.fenced("s", "h:1:a", token):
        pytest.fail("an expired holding ran its publish")
    newer = store.acquire_lease("s", "h:2:b", 30)
    with pytest.raises(LeaseLost, match="h:2:b"), store.fenced("s", "h:1:a", token):
        pytest.fail("a superseded holding ran its publish")
    with store.fenced("s", "h:2:b", newer):
        pass
    with pytest.raises(LeaseLost, match="nobody"), store.fenced("never", "h:1:a", 1):
        pass


def test_fenced_holds_off_acquisition_until_the_publish_ends(store):
    """Inside the fence the lease cannot change hands, even once it expired meanwhile."""
    token = store.acquire_lease("s", "h:1:a", 1)
    got: list[int | None] = []
    with store.fenced("s", "h:1:a", token):
        t = threading.Thread(target=lambda: got.append(store.acquire_lease("s", "h:2:b", 30)))
        t.start()
        time.sleep(1.3)  # the lease expires while the publish runs
        assert got == []  # the contender waits on the lock (or was refused)
    t.join(10)
    if got[0] is None:  # PostgreSQL's lock timeout answered "held"; free now
        got[0] = store.acquire_lease("s", "h:2:b", 30)
    assert got[0] == token + 1


def test_a_dead_local_holder_is_taken_over_before_expiry(store):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    ghost = f"{host_id()}:{int(dead.stdout)}:old"
    assert holder_is_dead(ghost, host_id())
    assert not holder_is_dead(f"{host_id()}:{1}:init", host_id())  # alive
    assert not holder_is_dead(f"elsewhere:{int(dead.stdout)}:x", host_id())  # another host: unprovable
    token = store.acquire_lease("s", ghost, 300)
    leases = Leases(store, 30)
    holding = leases.acquire("s")
    assert holding is not None and holding.token == token + 1
    assert Leases(store, 30).acquire("s") is None  # this process is alive: no takeover


def test_orphans_are_candidates_of_older_holdings(store):
    rec = Record(id=new_id("rec"), scenario="s")
    store.add_record(rec)
    rpt = Report(id=new_id("rpt"), scenario="s", score=0.0, references=[rec.id], body_hash="h")
    store.add_report(rpt)
    old = CandidateRow(id=new_id("cand"), scenario="s", recipe="r", status="evaluating", lease_token=1)
    store.consume(old.id, "s", record_ids=[rec.id], report_ids=[rpt.id])
    store.add_candidate(old)
    mine = CandidateRow(id=new_id("cand"), scenario="s", recipe="r", status="evaluating", lease_token=2)
    store.add_candidate(mine)
    store.add_candidate(CandidateRow(id=new_id("cand"), scenario="t", recipe="r", status="evaluating",
                                     lease_token=1))
    orphans = orphans_of(store, "s", 2)
    assert [r.id for r in orphans] == [old.id]
    assert settle_orphans(store, orphans, 3) == [old.id]
    settled = store.get_candidate(old.id)
    assert settled.status == "error" and settled.reason.startswith("interrupted")
    assert store.get_candidate(mine.id).status == "evaluating"
    assert store.counts("s")["returned_reports"] == 1


# ---------------------------------------------------------------------- in a kernel


class Down:
    """An upstream nobody listens on: these tests never call the model."""

    url, dialect = "http://127.0.0.1:9", "openai"


class StealingRecipe:
    """Proposes a new rule; while it runs, another process takes the scenario's lease over (as
    when this one is paused past the expiry)."""

    update_target = "harness"
    filters = ()
    default_evaluator = "always"

    def __init__(self, batch_size: int = 1, steal: bool = True):
        self.batch_size = batch_size
        self.steal = steal

    def propose(self, batch, current, ctx):
        if self.steal:
            lease = ctx.store.get_lease(batch.scenario)
            assert ctx.store.acquire_lease(batch.scenario, "elsewhere:1:x", 30,
                                           take_from=(lease.holder, lease.token)) == lease.token + 1
        art = ctx.new_artifact()
        (art / "harness").mkdir(exist_ok=True)
        (art / "harness" / "rules.md").write_text("- Be brief.\n")
        return Candidate(scenario=batch.scenario, recipe="stealing", artifact_dir=art, summary="a rule")


def _kernel(tmp_path, store_url: str, **recipe: object):
    add_plugin("recipe", "stealing", StealingRecipe)
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always"})
    config["recipe"] = {"name": "stealing", "batch_size": 1, **recipe}
    config["record_store"] = {"url": store_url}
    return build_reef(settings_for(tmp_path, Down, config), get_plugins(), background=False)


def _seed(store: RecordStore) -> str:
    rec = Record(id=new_id("rec"), scenario="default")
    store.add_record(rec)
    rpt = Report(id=new_id("rpt"), scenario="default", score=0.0, feedback="Be brief", references=[rec.id],
                 body_hash=new_id("h"))
    store.add_report(rpt)
    return rpt.id


def test_a_step_that_lost_its_lease_is_fenced_and_never_publishes(tmp_path, store_url):
    reef = _kernel(tmp_path, store_url)
    rpt = _seed(reef.store)
    [step] = grow_steps(reef)
    assert step.outcome == "fenced" and "elsewhere:1:x" in step.reason
    [cand] = reef.store.list_candidates("default")
    assert cand.status == "fenced" and cand.lease_token == 1
    assert reef.store.list_releases("default") == []
    assert reef.store.consumption_states([rpt]) == {rpt: ("returned", 1)}  # it trained nothing that serves
    assert reef.releases.chain.artifacts.history("default") == []


def test_a_step_waits_for_a_live_holder_elsewhere(tmp_path, store_url):
    reef = _kernel(tmp_path, store_url, steal=False)
    _seed(reef.store)
    token = reef.store.acquire_lease("default", f"{host_id()}:1:init", 30)  # pid 1 lives
    [busy] = grow_steps(reef)
    assert busy.outcome == "busy" and reef.store.list_candidates("default") == []
    reef.store.release_lease("default", f"{host_id()}:1:init", token)
    [step] = grow_steps(reef)
    assert step.outcome == "published"
    [cand] = reef.store.list_candidates("default")
    assert cand.status == "published" and cand.lease_token == token + 1


def test_start_up_settles_only_candidates_whose_lease_is_provably_dead(tmp_path, store_url):
    reef = _kernel(tmp_path, store_url, steal=False)
    store = reef.store
    live = CandidateRow(id=new_id("cand"), scenario="default", recipe="r", status="evaluating", lease_token=1)
    store.add_candidate(live)
    store.acquire_lease("default", f"elsewhere:{1}:x", 30)  # another host: alive as far as anyone here knows
    reef.learning._settle_interrupted()
    assert store.get_candidate(live.id).status == "evaluating"

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    ghost = CandidateRow(id=new_id("cand"), scenario="other", recipe="r", status="selected", lease_token=1)
    store.add_candidate(ghost)
    store.acquire_lease("other", f"{host_id()}:{int(dead.stdout)}:old", 30)  # this host, its process gone
    reef.learning._settle_interrupted()
    assert store.get_candidate(ghost.id).status == "error"
    assert store.get_candidate(live.id).status == "evaluating"
    assert store.get_lease("other").expires_at <= store.lease_clock()  # released after settling


def test_a_lease_lost_to_a_blocked_heartbeat_says_so(store, caplog):
    """The heartbeat renews every third of the TTL; a process that cannot run it for longer than
    the TTL (here its event loop blocked) loses the lease, and the warning says it was late, not
    taken, so the log explains a step that then fails with ``LeaseLost``."""
    async def blocked() -> bool:
        leases = Leases(store, ttl_s=1.0)
        async with leases.hold("s") as holding:
            time.sleep(2.0)  # the loop cannot run the heartbeat: the lease expires under it
            for _ in range(50):
                if holding.lost:
                    break
                await asyncio.sleep(0.1)
            return holding.lost

    with caplog.at_level(logging.WARNING, logger="reef.grow"):
        assert asyncio.run(blocked())
    [message] = [r.getMessage() for r in caplog.records if "was lost" in r.getMessage()]
    assert "past loop.lease_ttl_s 1 s: this process did not get to renew it in time" in message
    assert late_renewal(5.0, 30.0) == ""  # renewed recently: taken or released by another, not late
    assert "its last renewal was 31.0 s earlier" in late_renewal(31.0, 30.0)


def test_a_slow_renewal_keeps_the_lease_and_warns(store, caplog):
    """A renewal extends the expiry from when it starts; one that takes longer than a third of
    the TTL (its database slow) must not push the next one past the expiry: the next beat is due
    a third of the TTL after the last one started. Before, a renewal taking 1.5 s of a 2 s TTL
    lost the lease on the next beat."""
    def slow_renew(*args):  # the expiry is set from the statement's start, the commit is slow to return
        renewed = RecordStore.renew_lease(store, *args)
        if renewed:  # a refusal returns at once, so a lost lease shows within the block
            time.sleep(1.5)
        return renewed

    async def held() -> bool:
        leases = Leases(store, ttl_s=2.0)
        store.renew_lease = slow_renew  # the instance's, for this holding's heartbeat
        async with leases.hold("s") as holding:
            await asyncio.sleep(3.2)  # two renewals, each 1.5 s long (the old schedule's second came too late)
            return holding.lost

    with caplog.at_level(logging.WARNING, logger="reef.grow"):
        assert asyncio.run(held()) is False
    assert any("renewing the growth lease started" in r.getMessage() and "took 1.5 s" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_the_lease_listener_says_once_in_one_line_that_the_database_is_away(monkeypatch, caplog):
    """A PostgreSQL that is down (restarting, unreachable) makes the listener retry every
    ``LISTEN_RETRY_S``: one warning line when it goes, no traceback, not one per retry."""
    import socket

    from reef_core.grow import lease

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(lease, "LISTEN_RETRY_S", 0.05, raising=False)
    listener = lease.LeaseListener(f"postgresql+psycopg://reef@127.0.0.1:{port}/nothing", lambda _: None)
    with caplog.at_level("WARNING", logger="reef.grow"):
        listener.start()
        time.sleep(2.3)  # dozens of retries (and more than one before the fix, which waited 2 s)
        listener.stop()
    said = [r for r in caplog.records if "listening for growth lease releases" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert not said[0].exc_info and "\n" not in said[0].getMessage()
    assert "OperationalError" in said[0].getMessage()
