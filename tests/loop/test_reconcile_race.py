"""``ReleaseChain.reconcile`` while other processes publish on the same state directory.

Publishing writes the artifact store (compare-and-swap on a ref) first and the database row
second, so the database may lag the store, never lead it. A reconcile that read the store
first and the database second took a release published in between for corruption; these
tests pin the race down deterministically, run it for real across processes, and check that
true corruption still stops start-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reef_core.builtins.git_store import GitArtifactStore
from reef_core.commit import ChainInconsistent, ReleaseChain
from reef_core.store import CandidateRow, RecordStore, Release, new_id

MESSAGE = "artifact store does not have it; restore the artifact store or the database"


def _artifact(root: Path, rules: str) -> Path:
    (root / "harness").mkdir(parents=True, exist_ok=True)
    (root / "harness" / "rules.md").write_text(rules)
    return root


class HookedStore:
    """The git store, with ``hook(scenario, history)`` run after each ``history`` read and
    before it is returned: the moment another process acts between reconcile's reads."""

    def __init__(self, inner: GitArtifactStore, hook):
        self.inner = inner
        self.hook = hook
        self.history_reads = 0

    def history(self, scenario: str):
        self.history_reads += 1
        history = self.inner.history(scenario)
        return self.hook(scenario, history)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def state(tmp_path):
    """(records, other chain): the database and a second chain on the same state directory,
    standing for another server process."""
    records = RecordStore(f"sqlite:///{tmp_path / 'reef.db'}")
    other = ReleaseChain(GitArtifactStore(state_dir=tmp_path), records, tmp_path / "releases-other")
    yield records, other
    records.close()


def _publish(chain: ReleaseChain, tmp_path: Path, rules: str, *, record: bool = True, candidate_id=None):
    head = chain.head("s")
    stored = chain.publish("s", _artifact(tmp_path / new_id("art"), rules),
                           expected_head=head.release_id if head else None, candidate_id=candidate_id)
    return chain.record(stored) if record else stored


def _agrees(records: RecordStore, store: GitArtifactStore) -> bool:
    return [r.release_id for r in records.list_releases("s")] == [s.release_id for s in store.history("s")]


def test_a_release_published_and_recorded_between_the_reads_is_not_corruption(state, tmp_path):
    records, other = state
    _publish(other, tmp_path, "- one\n")
    published: list[Release] = []

    def another_process_publishes(scenario, history):
        if not published:  # once: the store was read, now a whole publish happens elsewhere
            published.append(_publish(other, tmp_path, "- two\n"))
        return history

    hooked = HookedStore(GitArtifactStore(state_dir=tmp_path), another_process_publishes)
    chain = ReleaseChain(hooked, records, tmp_path / "releases")
    assert chain.reconcile() == []  # raised ChainInconsistent when the store was read first
    assert published and chain.head("s").release_id == published[0].release_id
    assert chain.reconcile() == []
    assert _agrees(records, hooked.inner)


def test_a_release_between_the_two_writes_is_recorded_once(state, tmp_path):
    """Another process moved the store's ref and has not written its row yet: reconcile records
    the release from its manifest; the publisher's own ``record`` then finds that row."""
    records, other = state
    _publish(other, tmp_path, "- one\n")
    cand = new_id("cand")
    records.add_candidate(CandidateRow(id=cand, scenario="s", recipe="t", status="selected"))
    pending = []

    def another_process_publishes(scenario, history):
        if not pending:
            pending.append(_publish(other, tmp_path, "- two\n", record=False, candidate_id=cand))
        return history

    hooked = HookedStore(GitArtifactStore(state_dir=tmp_path), another_process_publishes)
    chain = ReleaseChain(hooked, records, tmp_path / "releases")
    chain.reconcile()  # before the publish: nothing to do; the hook publishes during its store read
    added = chain.reconcile()
    assert [r.release_id for r in added] == [pending[0].release_id]
    assert other.record(pending[0]).release_id == pending[0].release_id  # the publisher's late write
    assert records.get_candidate(cand).status == "published"
    assert _agrees(records, hooked.inner)


def test_a_stale_store_read_is_re_read_before_calling_it_corruption(state, tmp_path):
    records, other = state
    _publish(other, tmp_path, "- one\n")
    _publish(other, tmp_path, "- two\n")
    stale = [True]

    def first_read_misses_the_head(scenario, history):
        if stale[0]:
            stale[0] = False
            return history[1:]
        return history

    hooked = HookedStore(GitArtifactStore(state_dir=tmp_path), first_read_misses_the_head)
    chain = ReleaseChain(hooked, records, tmp_path / "releases")
    assert chain.reconcile() == []
    assert hooked.history_reads == 2


def test_true_corruption_still_stops_start_up(state, tmp_path):
    records, other = state
    kept = _publish(other, tmp_path, "- one\n")
    records.add_release(Release(scenario="s", sequence=2, release_id="rel_gone", parent_id=kept.release_id,
                                content_hash="0" * 64, operation="train", git_commit="f" * 40))
    hooked = HookedStore(GitArtifactStore(state_dir=tmp_path), lambda scenario, history: history)
    chain = ReleaseChain(hooked, records, tmp_path / "releases")
    with pytest.raises(ChainInconsistent, match="the database lists release rel_gone of scenario 's'") as info:
        chain.reconcile()
    assert MESSAGE in str(info.value)
    assert hooked.history_reads == 2  # the store was read afresh before the verdict


_WORKER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from reef_core.builtins.git_store import GitArtifactStore
    from reef_core.commit import ChainInconsistent, ReleaseChain
    from reef_core.errors import PublishConflict
    from reef_core.store import RecordStore

    state, name, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    records = RecordStore(f"sqlite:///{state / 'reef.db'}")
    chain = ReleaseChain(GitArtifactStore(state_dir=state), records, state / f"releases-{name}")
    out = {"published": 0, "conflicts": 0, "inconsistent": []}
    for i in range(rounds):
        try:
            chain.reconcile()
        except ChainInconsistent as exc:
            out["inconsistent"].append(str(exc))
        art = state / f"art-{name}-{i}" / "harness"
        art.mkdir(parents=True)
        (art / "rules.md").write_text(f"- {name} {i}\\n")
        head = chain.head("s")
        try:
            stored = chain.publish("s", art.parent, expected_head=head.release_id if head else None)
        except PublishConflict:
            out["conflicts"] += 1
            continue
        chain.record(stored)
        out["published"] += 1
    records.close()
    print(json.dumps(out))
""")


def test_two_processes_publishing_and_reconciling_see_no_false_corruption(tmp_path):
    rounds = 25
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    RecordStore(f"sqlite:///{tmp_path / 'reef.db'}").close()  # schema made once, before the race
    GitArtifactStore(state_dir=tmp_path)._ensure_repo()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path), name, str(rounds)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for name in ("a", "b")]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert [r["inconsistent"] for r in results] == [[], []]
    assert all(r["published"] + r["conflicts"] == rounds for r in results)
    records = RecordStore(f"sqlite:///{tmp_path / 'reef.db'}")
    try:
        store = GitArtifactStore(state_dir=tmp_path)
        assert ReleaseChain(store, records, tmp_path / "releases").reconcile() == []
        assert _agrees(records, store)
        assert len(records.list_releases("s")) == sum(r["published"] for r in results)
    finally:
        records.close()


def test_a_release_this_process_is_publishing_is_recorded_without_a_crash_warning(tmp_path, state, caplog):
    """The release follower of a server may reconcile between its own publish's two writes
    (store, then database): that is no crash and says nothing alarming; a release another
    process put in the store and never recorded still warns."""
    import logging

    records, other = state
    chain = ReleaseChain(GitArtifactStore(state_dir=tmp_path), records, tmp_path / "releases")
    mine = chain.publish("s", _artifact(tmp_path / "a1", "mine\n"), expected_head=None)
    with caplog.at_level(logging.DEBUG, logger="reef.commit"):
        assert [r.release_id for r in chain.reconcile(["s"])] == [mine.release_id]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert chain.record(mine).release_id == mine.release_id  # the publisher's own write finds it recorded
    caplog.clear()
    theirs = other.publish("s", _artifact(tmp_path / "a2", "theirs\n"), expected_head=mine.release_id)
    with caplog.at_level(logging.WARNING, logger="reef.commit"):
        assert [r.release_id for r in chain.reconcile(["s"])] == [theirs.release_id]
    assert "the database missed it" in caplog.text
