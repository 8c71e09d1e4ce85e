"""The release chain: compare-and-swap, racing publishers, rollback, reconciliation, LFS."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading

import pytest

from reef_core.builtins.git_store import GitArtifactStore, scenario_ref
from reef_core.commit import (
    ArtifactError,
    ChainInconsistent,
    ReleaseChain,
    content_hash,
)
from reef_core.compose import build_reef
from reef_core.errors import PublishConflict
from reef_core.plugins import get_plugins
from reef_core.store import Record, RecordStore, Report, new_id
from reef_core.types import Candidate

from .conftest import add_plugin, feedback_rules_config, settings_for


def _artifact(root, rules: str, **extra: bytes):
    (root / "harness").mkdir(parents=True, exist_ok=True)
    (root / "harness" / "rules.md").write_text(rules)
    for name, data in extra.items():
        (root / "adapter").mkdir(exist_ok=True)
        (root / "adapter" / name.replace("_", ".")).write_bytes(data)
    return root


@pytest.fixture
def chain(tmp_path):
    store = RecordStore(f"sqlite:///{tmp_path / 'reef.db'}")
    yield ReleaseChain(GitArtifactStore(state_dir=tmp_path), store, tmp_path / "releases")
    store.close()


def test_publish_record_and_stale_head_conflict(chain, tmp_path):
    first = chain.record(chain.publish("s", _artifact(tmp_path / "a", "- one\n"), expected_head=None))
    assert first.sequence == 1 and first.parent_id is None
    with pytest.raises(PublishConflict, match="expected head none"):
        chain.publish("s", _artifact(tmp_path / "b", "- two\n"), expected_head=None)
    second = chain.record(chain.publish("s", tmp_path / "b", expected_head=first.release_id))
    assert second.sequence == 2 and second.parent_id == first.release_id
    with pytest.raises(PublishConflict):
        chain.publish("s", _artifact(tmp_path / "c", "- three\n"), expected_head=first.release_id)
    assert [s.release_id for s in chain.artifacts.history("s")] == [second.release_id, first.release_id]
    manifest = chain.manifest(second)
    assert manifest["content_hash"] == content_hash(tmp_path / "b") == second.content_hash
    assert manifest["files"] == {"harness/rules.md": manifest["files"]["harness/rules.md"]}
    assert "-- one" in chain.diff(second) and "+- two" in chain.diff(second)


def test_racing_publishers_one_wins(chain, tmp_path):
    barrier = threading.Barrier(8)
    outcomes: list[object] = []

    def publish(i: int) -> None:
        art = _artifact(tmp_path / f"r{i}", f"- rule {i}\n")
        barrier.wait()
        try:
            outcomes.append(chain.publish("race", art, expected_head=None))
        except PublishConflict as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(not isinstance(o, PublishConflict) for o in outcomes) == 1
    assert len(chain.artifacts.history("race")) == 1


def test_rollback_republishes_content_and_keeps_history(chain, tmp_path):
    a = chain.record(chain.publish("s", _artifact(tmp_path / "a", "- a\n"), expected_head=None))
    b = chain.record(chain.publish("s", _artifact(tmp_path / "b", "- b\n"), expected_head=a.release_id))
    c = chain.record(chain.rollback("s", a.release_id))
    assert c.operation == "rollback" and c.sequence == 3 and c.parent_id == b.release_id
    assert c.content_hash == a.content_hash != b.content_hash
    assert chain.manifest(c)["rollback_to"] == a.release_id
    assert [r.release_id for r in chain.records.list_releases("s")] == [c.release_id, b.release_id, a.release_id]
    served = chain.materialize(c)
    assert (served.harness_dir / "rules.md").read_text() == "- a\n"


def test_reconcile_records_what_the_database_missed(chain, tmp_path):
    a = chain.record(chain.publish("s", _artifact(tmp_path / "a", "- a\n"), expected_head=None))
    cand = new_id("cand")
    from reef_core.store import CandidateRow

    chain.records.add_candidate(CandidateRow(id=cand, scenario="s", recipe="t", status="selected"))
    missed = chain.publish("s", _artifact(tmp_path / "b", "- b\n"), expected_head=a.release_id,
                           candidate_id=cand)
    assert chain.head("s").release_id == a.release_id
    added = chain.reconcile()
    assert [r.release_id for r in added] == [missed.release_id]
    assert chain.head("s").release_id == missed.release_id and chain.head("s").git_commit == missed.commit
    assert chain.records.get_candidate(cand).status == "published"
    assert chain.reconcile() == []


def test_reconcile_refuses_a_database_ahead_of_the_store(chain, tmp_path):
    chain.record(chain.publish("s", _artifact(tmp_path / "a", "- a\n"), expected_head=None))
    shutil.rmtree(chain.artifacts.path)
    fresh = ReleaseChain(GitArtifactStore(state_dir=tmp_path), chain.records, tmp_path / "releases2")
    with pytest.raises(ChainInconsistent, match="artifact store does not have it"):
        fresh.reconcile()


def test_scenario_names_become_safe_refs(chain, tmp_path):
    for name in ("a b", "x/../y", "support.v2", "..lock"):
        chain.record(chain.publish(name, _artifact(tmp_path / name.replace("/", "_"), f"- {name}\n"),
                                   expected_head=None))
        ref = scenario_ref(name)
        assert subprocess.run(["git", "check-ref-format", ref]).returncode == 0
    assert set(chain.artifacts.scenarios()) == {"a b", "x/../y", "support.v2", "..lock"}


@pytest.mark.skipif(shutil.which("git-lfs") is None, reason="git-lfs is not installed")
def test_binary_files_go_to_lfs_and_come_back(chain, tmp_path):
    weights = bytes(range(256)) * 64
    art = _artifact(tmp_path / "a", "- a\n", weights_safetensors=weights)
    stored = chain.publish("s", art, expected_head=None)
    pointer = subprocess.run(["git", f"--git-dir={chain.artifacts.path}", "cat-file", "-p",
                              f"{stored.commit}:adapter/weights.safetensors"], capture_output=True, text=True)
    assert pointer.stdout.startswith("version https://git-lfs.github.com/spec/v1")
    served = chain.materialize(chain.record(stored))
    assert (served.path / "adapter" / "weights.safetensors").read_bytes() == weights


def test_without_git_lfs_binaries_are_refused_with_a_clear_message(tmp_path):
    store = GitArtifactStore(state_dir=tmp_path)
    store.lfs_available = False
    art = _artifact(tmp_path / "a", "- a\n", weights_bin=b"\0\1\2")
    with pytest.raises(ArtifactError, match="must be stored with Git LFS, but git-lfs is not installed"):
        store.publish("s", art, {"release_id": "r", "scenario": "s", "sequence": 1,
                                 "content_hash": content_hash(art)}, expected_head=None)
    text_only = _artifact(tmp_path / "b", "- b\n")
    assert store.publish("s", text_only, {"release_id": "r", "scenario": "s", "sequence": 1,
                                          "content_hash": content_hash(text_only)}, expected_head=None)


def test_a_damaged_store_fails_materialize(chain, tmp_path):
    stored = chain.publish("s", _artifact(tmp_path / "a", "- a\n"), expected_head=None)
    manifest = dict(stored.manifest, content_hash="0" * 64)
    chain.artifacts._manifests[stored.commit] = manifest
    with pytest.raises(ArtifactError, match="damaged"):
        chain.artifacts.materialize("s", stored.commit, tmp_path / "out")


def test_artifacts_with_links_or_odd_names_are_refused(tmp_path):
    art = _artifact(tmp_path / "a", "- a\n")
    (art / "harness" / "link.md").symlink_to(art / "harness" / "rules.md")
    with pytest.raises(ArtifactError, match="symbolic link"):
        content_hash(art)
    (art / "harness" / "link.md").unlink()
    (art / "harness" / ".hidden").write_text("x")
    with pytest.raises(ArtifactError, match="not allowed"):
        content_hash(art)


# --------------------------------------------------------------------------- two kernels race


class BarrierRecipe:
    """Proposes a new rule, then waits until two proposals exist before returning both
    (servers with their own stores racing through one git remote: test_git_remote.py)."""

    update_target = "harness"
    filters = ("scored",)
    batch_size = 1
    default_evaluator = "always"
    entered = threading.Event()
    barrier = threading.Barrier(2, timeout=30)

    def propose(self, batch, current_artifact, ctx):
        art = ctx.new_artifact()
        (art / "harness").mkdir(exist_ok=True)
        (art / "harness" / "rules.md").write_text(f"- {batch.items[0].feedback_text()}\n")
        type(self).entered.set()
        type(self).barrier.wait()
        return Candidate(scenario=batch.scenario, recipe="barrier", artifact_dir=art)


class HoldRecipe(BarrierRecipe):
    """Proposes a new rule, then holds its step until the test lets it go."""

    entered = threading.Event()
    go = threading.Event()

    def propose(self, batch, current_artifact, ctx):
        art = ctx.new_artifact()
        (art / "harness").mkdir(exist_ok=True)
        (art / "harness" / "rules.md").write_text(f"- {batch.items[0].feedback_text()}\n")
        type(self).entered.set()
        type(self).go.wait(30)
        return Candidate(scenario=batch.scenario, recipe="hold", artifact_dir=art)


def _seed(store: RecordStore, scenario: str, n: int) -> None:
    for i in range(n):
        rec = Record(id=new_id("rec"), scenario=scenario, request={"messages": [{"role": "user", "content": str(i)}]},
                     response={"choices": [{"message": {"content": "?"}}]})
        store.add_record(rec)
        store.add_report(Report(id=new_id("rpt"), scenario=scenario, score=0.0, feedback=f"rule {i}",
                                references=[rec.id], body_hash=str(i)))


def test_two_servers_on_one_store_run_one_step_at_a_time(tmp_path):
    """Two kernels on one record store: while one runs a growth step the other's grow answers
    ``busy`` (the scenario's growth lease), so one release is published and no candidate is
    wasted. Races between servers with their own stores, through a shared git remote, end in
    ``conflict``: tests/loop/test_git_remote.py."""
    add_plugin("recipe", "hold", HoldRecipe)
    HoldRecipe.entered.clear()
    HoldRecipe.go.clear()

    class Down:
        url, dialect = "http://127.0.0.1:9", "openai"

    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always"})
    config["recipe"] = {"name": "hold"}
    settings = settings_for(tmp_path, Down, config)
    one, two = (build_reef(settings, get_plugins(), background=False) for _ in range(2))
    _seed(one.store, "default", 2)

    async def race():
        for reef in (one, two):
            await reef.start()
        try:
            first = asyncio.create_task(one.learning.grow("default"))
            await asyncio.to_thread(HoldRecipe.entered.wait, 30)
            second = await two.learning.grow("default")
            HoldRecipe.go.set()
            return await first, second
        finally:
            HoldRecipe.go.set()
            for reef in (one, two):
                await reef.stop()

    first, second = asyncio.run(race())
    assert (first.outcome, second.outcome) == ("published", "busy")
    assert second.candidate_id is None
    store = RecordStore(settings.record_store_url)
    assert len(store.list_releases("default")) == 1
    assert [c.status for c in store.list_candidates("default")] == ["published"]
    store.close()


def test_a_stale_ref_lock_is_a_clear_error_not_a_conflict(chain, tmp_path):
    """A git process killed while moving a scenario's ref leaves ``<ref>.lock`` behind: every
    publish then fails. The head did not move, so that is no conflict (a conflict sends the
    step to retry its batch at once on a "new" head, which here never changes): an error that
    names the lock file, and publishing works again once it is removed."""
    first = chain.record(chain.publish("s", _artifact(tmp_path / "a", "- one\n"), expected_head=None))
    lock = chain.artifacts.path / f"{scenario_ref('s')}.lock"
    lock.write_text("")
    with pytest.raises(ArtifactError, match=r"head did not move.*s\.lock behind: remove it") as err:
        chain.publish("s", _artifact(tmp_path / "b", "- two\n"), expected_head=first.release_id)
    assert not isinstance(err.value, PublishConflict) and "\n" not in str(err.value)
    assert [s.release_id for s in chain.artifacts.history("s")] == [first.release_id]
    with pytest.raises(PublishConflict):  # a stale expected head is still a conflict, lock or not
        chain.publish("s", tmp_path / "b", expected_head=None)
    lock.unlink()
    second = chain.record(chain.publish("s", tmp_path / "b", expected_head=first.release_id))
    assert second.sequence == 2


def test_a_growth_step_facing_a_stale_ref_lock_ends_in_error(tmp_path, caplog):
    """The step ends in ``error`` naming the lock (a ``conflict`` would make the worker retry the
    batch at once, spending its attempts against a head that never moved), and says so in one
    log line, without a traceback."""
    class Down:
        url, dialect = "http://127.0.0.1:9", "openai"

    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always"}, batch_size=1)
    settings = settings_for(tmp_path, Down, config)
    reef = build_reef(settings, get_plugins(), background=False)
    _seed(reef.store, "default", 1)

    async def grow():
        await reef.start()
        try:
            lock = reef.releases.artifacts.path / f"{scenario_ref('default')}.lock"
            lock.parent.mkdir(parents=True, exist_ok=True)
            lock.write_text("")
            return await reef.learning.grow("default")
        finally:
            await reef.stop()

    result = asyncio.run(grow())
    assert result.outcome == "error" and "remove it" in result.reason, result
    assert [c.status for c in reef.store.list_candidates("default")] == ["error"]
    assert reef.store.list_releases("default") == []
    said = [r for r in caplog.records if "publishing failed" in r.getMessage()]
    assert len(said) == 1 and not said[0].exc_info and "\n" not in said[0].getMessage()


def test_a_damaged_repository_head_is_one_clear_line(tmp_path):
    """A HEAD file left empty (a crash of the machine while it was written, a bad restore): the
    CLI and the server say in one line what is wrong and how to repair it, not a traceback."""
    import os
    import sys

    store = RecordStore(f"sqlite:///{tmp_path / 'reef.db'}")
    chain = ReleaseChain(GitArtifactStore(state_dir=tmp_path), store, tmp_path / "releases")
    chain.record(chain.publish("default", _artifact(tmp_path / "a", "- one\n"), expected_head=None))
    store.close()
    (tmp_path / "artifacts.git" / "HEAD").write_text("")
    with pytest.raises(ArtifactError, match="not a git repository git can open.*HEAD holds nothing"):
        GitArtifactStore(state_dir=tmp_path).heads()
    env = {**os.environ, "REEF_PLUGINS": ""}
    p = subprocess.run([sys.executable, "-m", "reef_core", "releases", f"server.state_dir={tmp_path}",
                        "runtime.upstream_url=http://127.0.0.1:9", "--force"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("Error: the artifact store") and p.stderr.count("\n") == 1, p.stderr
    (tmp_path / "artifacts.git" / "HEAD").write_text("ref: refs/heads/master\n")  # the repair it names
    assert list(GitArtifactStore(state_dir=tmp_path).heads()) == ["default"]
