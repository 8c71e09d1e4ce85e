"""A release chain shared through a git remote: servers on their own state directories publish
to one bare repository (``file://``, and smart HTTP through ``git http-backend``) by
compare-and-swap on the scenario ref, follow each other's heads, and round-trip LFS files."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from reef_core.builtins.git_store import GitArtifactStore, scenario_ref
from reef_core.commit import ArtifactError, ReleaseChain, content_hash
from reef_core.commit.serving import FOLLOW_INTERVAL_S
from reef_core.compose import build_reef
from reef_core.errors import PublishConflict
from reef_core.plugins import get_plugins
from reef_core.store import RecordStore
from reef_core.testing import check_artifact_store

from .conftest import add_plugin, feedback_rules_config, settings_for
from .git_http import GitHttpServer
from .test_chain import BarrierRecipe, _seed

ADAPTER = bytes(range(256)) * 64  # binary: stored with Git LFS


def _bare(path: Path) -> str:
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    return path.as_uri()


@pytest.fixture(params=["file", "http", "git-daemon"])
def remote(request, tmp_path):
    """{remote, lfs_url}: a bare repository reached over ``file://``, or over smart HTTP or the
    git protocol with its LFS objects in a ``file://`` LFS endpoint (``http-backend`` and
    ``git daemon`` have no LFS API)."""
    if request.param == "file":
        yield {"remote": _bare(tmp_path / "remote.git")}
        return
    (tmp_path / "served").mkdir()
    if request.param == "http":
        with GitHttpServer(tmp_path / "served") as server:
            yield {"remote": server.bare("remote.git"), "lfs_url": _bare(tmp_path / "lfs.git")}
        return
    _bare(tmp_path / "served" / "remote.git")
    with _git_daemon(tmp_path / "served") as url:
        yield {"remote": f"{url}/remote.git", "lfs_url": _bare(tmp_path / "lfs.git")}


@contextmanager
def _git_daemon(root: Path):
    """``git daemon`` serving the repositories under ``root`` on a loopback port, pushes allowed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack",
                               "--listen=127.0.0.1", f"--port={port}", f"--base-path={root}", str(root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(500):  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert daemon.poll() is None, "git daemon exited"
                time.sleep(0.02)
        yield f"git://127.0.0.1:{port}"
    finally:
        daemon.terminate()
        daemon.wait(10)


def _artifact(root: Path, rules: str, adapter: bytes | None = None) -> Path:
    (root / "harness").mkdir(parents=True)
    (root / "harness" / "rules.md").write_text(rules)
    if adapter is not None:
        (root / "adapter").mkdir()
        (root / "adapter" / "adapter_model.safetensors").write_bytes(adapter)
    return root


class _Server:
    """One server's side of the chain: its own state directory, database and git cache."""

    def __init__(self, root: Path, remote: dict[str, str]):
        self.records = RecordStore(f"sqlite:///{root / 'reef.db'}")
        self.chain = ReleaseChain(GitArtifactStore(state_dir=root, **remote), self.records, root / "releases")

    def head_id(self, scenario: str) -> str | None:
        self.chain.reconcile([scenario])  # what the follower does when the remote head moved
        head = self.chain.head(scenario)
        return head.release_id if head else None


def test_the_store_contract_holds_through_a_remote(remote, tmp_path):
    caches = iter(range(100))
    history = check_artifact_store(lambda: GitArtifactStore(state_dir=tmp_path / f"cache{next(caches)}", **remote),
                                   tmp_path / "kit")
    assert len(history) == 2


def test_cas_rounds_have_one_winner_each_and_lfs_files_round_trip(remote, tmp_path):
    one, two = _Server(tmp_path / "one", remote), _Server(tmp_path / "two", remote)
    winners = []
    for round_ in range(3):
        expected = one.head_id("s")
        assert two.head_id("s") == expected
        barrier = threading.Barrier(2)
        outcomes: dict[str, object] = {}

        def publish(name: str, server: _Server, round_: int, barrier: threading.Barrier,
                    outcomes: dict[str, object], expected: str | None) -> None:
            art = _artifact(tmp_path / f"{name}{round_}", f"- {name} {round_}\n", ADAPTER + name.encode())
            barrier.wait()
            try:
                outcomes[name] = server.chain.record(server.chain.publish("s", art, expected_head=expected))
            except PublishConflict as exc:
                outcomes[name] = exc

        threads = [threading.Thread(target=publish, args=(name, server, round_, barrier, outcomes, expected))
                   for name, server in (("one", one), ("two", two))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [name for name, o in outcomes.items() if not isinstance(o, PublishConflict)]
        assert len(won) == 1, outcomes
        lost = next(o for o in outcomes.values() if isinstance(o, PublishConflict))
        assert "nothing was published" in str(lost)
        winners.append((won[0], outcomes[won[0]]))

    for server in (one, two):  # both see the same chain; the loser recorded the winners' rows from manifests
        server.head_id("s")
        assert [r.release_id for r in server.records.list_releases("s", newest_first=False)] == \
            [row.release_id for _, row in winners]
    for name, row in winners:  # the LFS adapter comes back byte for byte on the other side
        reader = two if name == "one" else one
        active = reader.chain.materialize(row)
        assert (active.path / "adapter" / "adapter_model.safetensors").read_bytes() == ADAPTER + name.encode()
        assert content_hash(active.path) == row.content_hash
    pointer = subprocess.run(["git", f"--git-dir={one.chain.artifacts.path}", "cat-file", "-p",
                              f"{scenario_ref('s')}:adapter/adapter_model.safetensors"],
                             capture_output=True, text=True, check=True).stdout
    assert pointer.startswith("version https://git-lfs.github.com/spec/v1"), "the adapter must be an LFS pointer"


def test_an_unreachable_remote_fails_the_publish_and_reads_serve_the_cache(tmp_path, caplog):
    url = _bare(tmp_path / "remote.git")
    store = GitArtifactStore(state_dir=tmp_path / "cache", remote=url)
    first = store.publish("s", _artifact(tmp_path / "a", "- a\n"), _manifest("s", tmp_path / "a", "r1"),
                          expected_head=None)
    (tmp_path / "remote.git").rename(tmp_path / "gone.git")
    with caplog.at_level(logging.WARNING, logger="reef.commit"):
        assert store.heads() == {"s": first.commit}
    assert "serving the local cache" in caplog.text
    with pytest.raises(ArtifactError, match="nothing was published") as err:
        store.publish("s", _artifact(tmp_path / "b", "- b\n"), _manifest("s", tmp_path / "b", "r2"),
                      expected_head=first.commit)
    assert not isinstance(err.value, PublishConflict)
    (tmp_path / "gone.git").rename(tmp_path / "remote.git")
    assert store.sync() and store.heads() == {"s": first.commit}


def _manifest(scenario: str, art: Path, release_id: str) -> dict:
    from reef_core.commit.artifacts import describe
    chash, files = describe(art)
    return {"format": 1, "scenario": scenario, "release_id": release_id, "sequence": 1, "parent": None,
            "content_hash": chash, "files": files, "operation": "train"}


def test_two_servers_race_through_the_remote_and_both_serve_the_winner(tmp_path):
    add_plugin("recipe", "barrier", BarrierRecipe)
    BarrierRecipe.entered.clear()
    BarrierRecipe.barrier.reset()

    class Down:
        url, dialect = "http://127.0.0.1:9", "openai"

    url = _bare(tmp_path / "remote.git")
    config = feedback_rules_config(loop_enabled=False, evaluator={"name": "always"})
    config["recipe"] = {"name": "barrier"}
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    # background: each kernel runs the follower of releases published elsewhere
    one, two = (build_reef(settings_for(tmp_path / name, Down, config, [f"artifact_store.remote={url}"]),
                           get_plugins()) for name in ("one", "two"))
    for reef in (one, two):
        _seed(reef.store, "default", 2)

    async def race():
        for reef in (one, two):
            await reef.start()
        try:
            first = asyncio.create_task(one.learning.grow("default"))
            await asyncio.to_thread(BarrierRecipe.entered.wait, 30)
            second = asyncio.create_task(two.learning.grow("default"))
            results = await asyncio.gather(first, second)
            winner = next(r for r in results if r.outcome == "published")
            deadline = time.monotonic() + 10 * FOLLOW_INTERVAL_S
            while time.monotonic() < deadline:
                serving = [reef.releases.serving("default") for reef in (one, two)]
                if all(s is not None and s.release_id == winner.release_id for s in serving):
                    break
                await asyncio.sleep(0.1)
            return results, [reef.releases.serving("default") for reef in (one, two)]
        finally:
            for reef in (one, two):
                await reef.stop()

    results, serving = asyncio.run(race())
    assert sorted(r.outcome for r in results) == ["conflict", "published"]
    winner = next(r for r in results if r.outcome == "published")
    assert [s.release_id if s else None for s in serving] == [winner.release_id] * 2
    loser = next(r for r in results if r.outcome == "conflict")
    loser_reef = one if loser is results[0] else two
    assert "moved on" in loser_reef.store.get_candidate(loser.candidate_id).reason


def test_remote_credentials_stay_out_of_logs_and_errors(tmp_path, caplog):
    store = GitArtifactStore(state_dir=tmp_path, remote="http://reef:s3cret-token@127.0.0.1:9/chain.git", timeout_s=10)
    with caplog.at_level(logging.WARNING, logger="reef.commit"):
        assert store.heads() == {}
    with pytest.raises(ArtifactError) as err:
        store.publish("s", _artifact(tmp_path / "a", "- a\n"), _manifest("s", tmp_path / "a", "r1"), expected_head=None)
    assert "reef:***@127.0.0.1:9" in caplog.text and "reef:***@127.0.0.1:9" in str(err.value)
    assert "s3cret-token" not in caplog.text + str(err.value)


def _init_store(path: str) -> str:
    store = GitArtifactStore(path=path, remote=None)
    store._ensure_repo()
    return store.path.as_posix()


def test_servers_starting_together_initialise_one_shared_repository(tmp_path):
    """Processes opening one new shared repository at the same moment all succeed (a lock
    across processes around git init and its config; git's config.lock used to make all
    but one fail)."""
    import multiprocessing

    path = str(tmp_path / "shared" / "releases.git")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        paths = pool.map(_init_store, [path] * 8)
    assert set(paths) == {Path(path).as_posix()}
    history = check_artifact_store(lambda: GitArtifactStore(path=path), tmp_path / "contract")
    assert len(history) >= 2  # the repository they made is one the store contract holds on
