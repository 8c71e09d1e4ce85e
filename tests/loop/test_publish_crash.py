"""Several processes on one store: a growth step killed at each step of its publish sequence,
and a step that loses the compare-and-swap. Whoever takes the scenario over next must leave
every report consumed by exactly one published candidate (never twice, never held by a dead
or conflicting candidate), the releases table equal to the artifact store's chain, and the
head served. On SQLite and PostgreSQL (``store_url``)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from reef_core.builtins.git_store import GitArtifactStore
from reef_core.commit import ArtifactError
from reef_core.commit.faults import FAULT_ENV, PUBLISH_STEPS
from reef_core.compose import build_reef
from reef_core.kernel import Reef
from reef_core.plugins import get_plugins
from reef_core.store import CandidateRow, Record, RecordStore, Report, new_id
from reef_core.types import Candidate

from .conftest import add_plugin, settings_for, write_config
from .ledger import LAUNCHER, Ledger, ledger_of

REPO = Path(__file__).resolve().parents[2]


class Down:
    """An upstream nobody listens on: the ledger recipe never calls the model."""

    url, dialect = "http://127.0.0.1:9", "openai"


def _config(tmp_path: Path, store_url: str) -> dict:
    return {"recipe": {"name": "ledger", "batch_size": 1}, "evaluator": {"name": "always"},
            "loop": {"enabled": False, "schedule_s": None}, "record_store": {"url": store_url},
            "artifact_store": {"path": str(tmp_path / "artifacts.git")}}


def _server(tmp_path: Path, name: str, config: dict, *, background: bool = False) -> Reef:
    """A kernel of its own state directory on the shared store and chain (the ledger recipe)."""
    add_plugin("recipe", "ledger", Ledger)
    (tmp_path / name).mkdir(exist_ok=True)
    return build_reef(settings_for(tmp_path / name, Down, config), get_plugins(), background=background)


def _report(store: RecordStore) -> str:
    rec = Record(id=new_id("rec"), scenario="default")
    store.add_record(rec)
    rpt = Report(id=new_id("rpt"), scenario="default", score=0.0, feedback="x", references=[rec.id],
                 body_hash=new_id("h"))
    store.add_report(rpt)
    return rpt.id


def _grow_and_die(tmp_path: Path, config: dict, step: str) -> subprocess.CompletedProcess:
    """``reef grow`` in another process that SIGKILLs itself right after ``step``."""
    cfg = write_config(tmp_path / "dying.yaml", config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env[FAULT_ENV] = step
    return subprocess.run([sys.executable, "-c", LAUNCHER, "grow", "-c", str(cfg),
                           f"server.state_dir={tmp_path / 'dying'}", f"runtime.upstream_url={Down.url}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


async def _grow_until_nothing(reef: Reef, limit: int = 8) -> list:
    """Growth steps until one finds nothing to do (a lease another process is letting go of
    answers busy for a moment: tried again)."""
    results = []
    for _ in range(limit):
        result = await reef.learning.grow("default")
        results.append(result)
        if result.outcome == "nothing":
            return results
        if result.outcome == "busy":
            await asyncio.sleep(0.5)
    pytest.fail(f"growth never ran out of work: {[(r.outcome, r.reason) for r in results]}")


async def _following(reef: Reef, git_path: Path, timeout_s: float = 30.0) -> None:
    """Wait until ``reef`` serves the head of the git chain (its follower polls every 2 s)."""
    head = GitArtifactStore(path=str(git_path)).head("default")
    for _ in range(int(timeout_s / 0.1)):
        serving = reef.releases.serving("default")
        if head is None or (serving is not None and serving.release_id == head.release_id):
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"the server never served the chain's head {head.release_id}")


def check_consumed_once(reef: Reef, reports: list[str], git_path: Path) -> None:
    """Every report consumed by exactly one published candidate (its ledger line appears once in
    the head, and its consumption is held by that candidate), no candidate left unsettled or
    holding experience unpublished, the releases table equal to the git chain, the head served."""
    store = reef.store
    rows = store.list_releases("default", newest_first=False)
    chain = list(reversed(GitArtifactStore(path=str(git_path)).history("default")))
    assert [(r.release_id, r.git_commit) for r in rows] == [(s.release_id, s.commit) for s in chain]
    serving = reef.releases.serving("default")
    assert serving is not None and serving.release_id == rows[-1].release_id
    assert Counter(ledger_of(serving.path)) == Counter(reports)  # none twice, none lost

    candidates = store.list_candidates("default")
    assert not [c.id for c in candidates if c.status in ("proposed", "evaluating", "selected")]
    published = {c.id: c for c in candidates if c.status == "published"}
    assert set(published) == {r.candidate_id for r in rows if r.candidate_id}  # rollbacks have none
    assert all(published[r.candidate_id].release_id == r.release_id for r in rows if r.candidate_id)
    for c in candidates:
        held = store.experience_of(c.id)["reports"].get("held", 0)
        assert held == (1 if c.id in published else 0), (c.id, c.status, c.reason, held)
    assert {state for state, _ in store.consumption_states(reports).values()} == {"held"}


@pytest.mark.parametrize("step", PUBLISH_STEPS)
def test_a_kill_at_each_publish_step_is_recovered_by_the_next_holder(tmp_path, store_url, step):
    """A process dies right after ``step`` of publishing its report's candidate; a server that
    was running all along (its start-up reconciled nothing) takes the scenario over, grows its
    own report and whatever returned, and ends with each report in the chain exactly once."""
    config = _config(tmp_path, store_url)
    survivor = _server(tmp_path, "survivor", config, background=True)  # it follows the chain

    async def scenario():
        await survivor.start()
        try:
            first = _report(survivor.store)
            killed = await asyncio.to_thread(_grow_and_die, tmp_path, config, step)
            assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
            own = _report(survivor.store)
            results = await _grow_until_nothing(survivor)
            # the follower reaches the chain's head (served already, unless the steps missed it),
            # and what that returns to the pool is grown too
            await _following(survivor, tmp_path / "artifacts.git")
            results += await _grow_until_nothing(survivor)
            check_consumed_once(survivor, [first, own], tmp_path / "artifacts.git")
            return results
        finally:
            await survivor.stop()

    results = asyncio.run(scenario())
    assert "conflict" not in {r.outcome for r in results}  # the survivor built on the recovered head
    store = RecordStore(store_url, migrate=False)
    try:
        [dead] = [c for c in store.list_candidates("default") if c.lease_token == 1]
        in_chain = PUBLISH_STEPS.index(step) >= PUBLISH_STEPS.index("git_published")
        assert dead.status == ("published" if in_chain else "error"), (dead.status, dead.reason)
    finally:
        store.close()


class Interloper(Ledger):
    """The ledger recipe; during its first ``times`` proposals another publisher moves the
    chain's head, as ``reef rollback`` does (it takes no growth lease), writing the release row
    or (``record=False``) dying before it."""

    chain = None  # the test sets the ReleaseChain the other publisher uses

    def __init__(self, batch_size: int = 1, times: int = 1, record: bool = True):
        super().__init__(batch_size)
        self.times, self.record, self.calls = times, record, 0

    def propose(self, batch: Any, current: Any, ctx: Any) -> Candidate:
        if self.calls < self.times:
            self.calls += 1
            art = ctx.new_artifact("interloper")
            (art / "harness").mkdir(exist_ok=True)
            (art / "harness" / "interloper.md").write_text(f"- {self.calls}\n")
            head = self.chain.head(batch.scenario)
            stored = self.chain.publish(batch.scenario, art, expected_head=head.release_id if head else None,
                                        operation="rollback")
            if self.record:
                self.chain.record(stored)
        return super().propose(batch, current, ctx)


def _interloper(tmp_path: Path, store_url: str, *, background: bool = False, **options: object) -> Reef:
    add_plugin("recipe", "interloper", Interloper)
    config = _config(tmp_path, store_url)
    config["recipe"] = {"name": "interloper", "batch_size": 1, **options}
    if background:
        config["loop"].update(enabled=True, max_attempts=3)
    reef = _server(tmp_path, "server", config, background=background)
    Interloper.chain = reef.releases.chain
    return reef


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "unrecorded"])
def test_a_conflict_returns_its_batch_and_the_next_step_builds_on_the_new_head(tmp_path, store_url, recorded):
    reef = _interloper(tmp_path, store_url, record=recorded)
    rpt = _report(reef.store)

    async def scenario():
        await reef.start()
        try:
            lost = await reef.learning.grow("default")
            assert lost.outcome == "conflict", (lost.outcome, lost.reason)
            assert reef.store.get_candidate(lost.candidate_id).status == "conflict"
            assert reef.store.consumption_states([rpt]) == {rpt: ("returned", 1)}  # not held for good
            moved = reef.store.head_release("default")  # recorded by the loser when its publisher died
            assert moved is not None and moved.operation == "rollback"
            assert reef.releases.serving("default").release_id == moved.release_id
            won, after = await reef.learning.grow("default"), await reef.learning.grow("default")
            assert (won.outcome, after.outcome) == ("published", "nothing")
            assert reef.store.get_candidate(won.candidate_id).base_release_id == moved.release_id
            assert reef.store.consumption_states([rpt]) == {rpt: ("held", 2)}
            check_consumed_once(reef, [rpt], tmp_path / "artifacts.git")
        finally:
            await reef.stop()

    asyncio.run(scenario())


def test_a_batch_that_keeps_conflicting_is_spent_after_max_attempts(tmp_path, store_url):
    reef = _interloper(tmp_path, store_url, times=10)
    rpt = _report(reef.store)

    async def scenario():
        await reef.start()
        try:
            return [await reef.learning.grow("default") for _ in range(4)]
        finally:
            await reef.stop()

    outcomes = [r.outcome for r in asyncio.run(scenario())]
    assert outcomes == ["conflict"] * 3 + ["nothing"]  # loop.max_attempts: 3
    assert reef.store.consumption_states([rpt]) == {rpt: ("spent", 3)}
    assert {c.status for c in reef.store.list_candidates("default")} == {"conflict"}


def test_a_server_retries_a_conflicting_batch_on_the_new_head_by_itself(tmp_path, store_url):
    """Automatic growth: the step after a conflict comes without another trigger."""
    reef = _interloper(tmp_path, store_url, background=True, record=False)
    rpt = _report(reef.store)

    async def scenario():
        await reef.start()  # its start-up wakes the scenario: a full batch waits
        try:
            for _ in range(300):
                if reef.store.list_candidates("default", status="published"):
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"nothing published: {[(c.status, c.reason) for c in reef.store.list_candidates('default')]}")
            check_consumed_once(reef, [rpt], tmp_path / "artifacts.git")
        finally:
            await reef.stop()

    asyncio.run(scenario())
    assert [c.status for c in reversed(reef.store.list_candidates("default"))] == ["conflict", "published"]


def test_nothing_is_settled_while_a_remote_chain_cannot_be_fetched(tmp_path, store_url):
    """A dead step may have pushed its release to the shared remote: until the remote answers,
    its candidate is left unsettled and nothing is consumed."""
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    config = _config(tmp_path, store_url)
    config["artifact_store"]["remote"] = remote.as_uri()
    reef = _server(tmp_path, "server", config)
    first, own = _report(reef.store), _report(reef.store)
    dead = CandidateRow(id=new_id("cand"), scenario="default", recipe="ledger", status="selected", lease_token=0)
    reef.store.add_candidate(dead)
    reef.store.consume(dead.id, "default", report_ids=[first])

    async def grow():
        await reef.start()
        try:
            return await reef.learning.grow("default")
        finally:
            await reef.stop()

    remote.rename(tmp_path / "away.git")
    cut_off = asyncio.run(grow())
    assert cut_off.outcome == "error" and "could not be fetched" in cut_off.reason
    assert reef.store.get_candidate(dead.id).status == "selected"
    assert reef.store.consumption_states([first, own]) == {first: ("held", 1)}

    (tmp_path / "away.git").rename(remote)
    reef = _server(tmp_path, "server", config)
    assert asyncio.run(grow()).outcome == "published"
    assert reef.store.get_candidate(dead.id).status == "error"  # it never reached the chain
    assert reef.store.consumption_states([first]) == {first: ("returned", 1)}


class LostAnswer:
    """The artifact store, whose next publish raises: after moving the head (``lands``: a push
    whose answer was lost) or before."""

    def __init__(self, inner: Any, lands: bool):
        self.inner, self.lands = inner, lands

    def publish(self, *args: Any, **kwargs: Any) -> Any:
        if self.lands:
            self.inner.publish(*args, **kwargs)
        raise ArtifactError("the connection to the store broke")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("lands", [True, False], ids=["landed", "not-landed"])
def test_a_publish_that_raises_is_settled_by_what_the_chain_holds(tmp_path, store_url, lands):
    reef = _server(tmp_path, "server", _config(tmp_path, store_url))
    rpt = _report(reef.store)
    chain = reef.releases.chain
    chain.artifacts = LostAnswer(chain.artifacts, lands)

    async def grow():
        await reef.start()
        try:
            return await reef.learning.grow("default")
        finally:
            await reef.stop()

    step = asyncio.run(grow())
    assert step.outcome == "error" and "the connection to the store broke" in step.reason
    candidate = reef.store.get_candidate(step.candidate_id)
    if lands:  # it is in the chain: recorded at once, its report consumed by it
        assert candidate.status == "published" and "all the same" in step.reason
        assert reef.store.head_release("default").candidate_id == candidate.id
        assert reef.store.consumption_states([rpt]) == {rpt: ("held", 1)}
    else:  # never published: an error whose report returns to the pool
        assert candidate.status == "error" and reef.store.list_releases("default") == []
        assert reef.store.consumption_states([rpt]) == {rpt: ("returned", 1)}
