"""Releases are untrusted input: whoever can push to the shared chain pushes a release commit
by hand, with ids, names and files no Reef would make, and every server that follows the chain
must refuse it — nothing written outside its state directory, no header broken — and keep
serving its last good release."""

from __future__ import annotations

import json
import logging
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from reef_core.builtins.git_store import GitArtifactStore, scenario_ref
from reef_core.commit import MANIFEST, ArtifactError, ReleaseChain
from reef_core.commit import serving as serving_module
from reef_core.commit.artifacts import describe
from reef_core.store import RecordStore, new_id
from reef_core.testing import FakeUpstream, ReefServer

from .conftest import wait_for

RULES = {"harness/rules.md": b"- be kind\n"}
RECEIPT = re.compile(r"rec_[0-9a-f]{32}\Z")


def _bare(path: Path) -> str:
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    return path.as_uri()


class Attacker:
    """Someone with push access to the chain's remote and plain git: builds release commits by
    hand (any manifest, any tree entry) on top of a scenario's head and pushes them."""

    def __init__(self, root: Path, remote: str):
        self.git_dir = root / "attacker.git"
        self.remote = remote
        subprocess.run(["git", "init", "-q", "--bare", str(self.git_dir)], check=True)

    def git(self, *args: str, data: bytes | None = None) -> str:
        done = subprocess.run(["git", f"--git-dir={self.git_dir}", *args], input=data, capture_output=True,
                              check=True, env={"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(self.git_dir),
                                               "GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x",
                                               "GIT_COMMITTER_NAME": "x", "GIT_COMMITTER_EMAIL": "x@x"})
        return done.stdout.decode().strip()

    def head(self, scenario: str) -> tuple[str, dict[str, Any]]:
        ref = scenario_ref(scenario)
        self.git("fetch", "-q", self.remote, f"+{ref}:{ref}")
        commit = self.git("rev-parse", ref)
        return commit, json.loads(self.git("cat-file", "blob", f"{commit}:{MANIFEST}"))

    def _tree(self, entries: dict[bytes, tuple[str, str]]) -> str:
        """A tree object of {path: (mode, object id)}, written as git writes trees (no checks)."""
        here: dict[bytes, tuple[str, str]] = {}
        below: dict[bytes, dict[bytes, tuple[str, str]]] = {}
        for path, entry in entries.items():
            first, _, rest = path.partition(b"/")
            if rest:
                below.setdefault(first, {})[rest] = entry
            else:
                here[first] = entry
        for name, sub in below.items():
            here[name] = ("40000", self._tree(sub))
        order = sorted(here, key=lambda n: n + (b"/" if here[n][0] == "40000" else b""))
        raw = b"".join(here[n][0].encode() + b" " + n + b"\0" + bytes.fromhex(here[n][1]) for n in order)
        return self.git("hash-object", "-t", "tree", "-w", "--literally", "--stdin", data=raw)

    def push(self, scenario: str, *, manifest: dict[str, Any] | bytes | None,
             files: dict[str, tuple[str, bytes]]) -> str:
        """Push a release commit on top of ``scenario``'s head: ``files`` ({path: (git mode,
        content)}; a link's content is its target) plus ``manifest`` (None: no manifest)."""
        parent, _ = self.head(scenario)
        entries = {p.encode(): (mode, self.git("hash-object", "-w", "--stdin", data=data))
                   for p, (mode, data) in files.items()}
        if manifest is not None:
            raw = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
            entries[MANIFEST.encode()] = ("100644", self.git("hash-object", "-w", "--stdin", data=raw))
        commit = self.git("commit-tree", self._tree(entries), "-p", parent, "-m", "release")
        self.git("push", "-q", self.remote, f"{commit}:{scenario_ref(scenario)}")
        return commit


def _next_manifest(attacker: Attacker, scenario: str, root: Path, files: dict[str, bytes]) -> dict[str, Any]:
    """What Reef would publish next: a well-formed manifest on top of the head, for ``files``."""
    _, head = attacker.head(scenario)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    chash, sums = describe(root)
    return {"format": head["format"], "scenario": scenario, "release_id": new_id("rel"),
            "sequence": head["sequence"] + 1, "parent": head["release_id"], "content_hash": chash,
            "files": sums, "operation": "train", "candidate_id": None, "evaluation": None}


def _plain(files: dict[str, bytes]) -> dict[str, tuple[str, bytes]]:
    return {p: ("100644", d) for p, d in files.items()}


def _outside(tmp_path: Path) -> Path:
    return tmp_path / "outside"


#: one change to an otherwise good manifest each; ``OUTSIDE`` stands for a path outside every state dir
OUTSIDE = "@outside@"
MANIFEST_CASES: dict[str, dict[str, Any]] = {
    "release_id up and out": {"release_id": "../../../escape"},
    "release_id up into the state dir": {"release_id": "../../escape"},
    "release_id absolute": {"release_id": OUTSIDE},
    "release_id CR LF": {"release_id": "a\r\nX-Injected: 1"},
    "release_id LF": {"release_id": "rel_1\nx"},
    "release_id NUL": {"release_id": "rel\x00x"},
    "release_id dot dot": {"release_id": ".."},
    "release_id dot": {"release_id": "."},
    "release_id empty": {"release_id": ""},
    "release_id slash": {"release_id": "a/b"},
    "release_id space": {"release_id": "rel 1"},
    "release_id unicode line separator": {"release_id": "rel\u2028x"},
    "release_id not a string": {"release_id": 7},
    "release_id missing": {"release_id": None},
    "release_id too long": {"release_id": "r" * 101},
    "parent traversal": {"parent": "../../p"},
    "parent of another chain": {"parent": "rel_someone_else"},
    "candidate_id traversal": {"candidate_id": "../../cand"},
    "candidate_id CR LF": {"candidate_id": "c\r\nX: 1"},
    "rollback_to absolute": {"rollback_to": "/etc"},
    "operation CR LF": {"operation": "train\r\nX: 1"},
    "scenario of another chain": {"scenario": "other"},
    "scenario traversal": {"scenario": "../default"},
    "sequence as text": {"sequence": "2"},
    "sequence skips ahead": {"sequence": 9},
    "sequence boolean": {"sequence": True},
    "content_hash traversal": {"content_hash": "../../x"},
    "file name up": {"files": {"../evil": "0" * 64}},
    "file name absolute": {"files": {OUTSIDE + "/x": "0" * 64}},
    "file name NUL": {"files": {"harness/a\x00b": "0" * 64}},
    "file name CR LF": {"files": {"harness/a\r\nb": "0" * 64}},
    "file name dot dir": {"files": {".git/config": "0" * 64}},
    "file name inner dot dot": {"files": {"harness/../../x": "0" * 64}},
    "checksum not a digest": {"files": {"harness/rules.md": "../x"}},
    "evaluation not an object": {"evaluation": "text"},
}
RAW_MANIFESTS: dict[str, bytes | None] = {
    "manifest not JSON": b"{not json",
    "manifest a list": b"[]",
    "manifest missing": None,
}


def _hostile_manifest(case: str, good: dict[str, Any], outside: Path) -> dict[str, Any] | bytes | None:
    if case in RAW_MANIFESTS:
        return RAW_MANIFESTS[case]
    text = json.dumps(MANIFEST_CASES[case]).replace(OUTSIDE, str(outside))
    return {**good, **json.loads(text)}


def _snapshot(root: Path, ignore: tuple[Path, ...]) -> set[str]:
    """Every path under ``root`` except inside ``ignore`` (git caches, databases)."""
    out = set()
    for p in root.rglob("*"):
        if not any(p == i or i in p.parents for i in ignore) and not p.name.startswith("reef.db"):
            out.add(p.relative_to(root).as_posix())
    return out


class _Follower:
    """A server's side of the chain: its own state directory, database and git cache."""

    def __init__(self, root: Path, remote: str):
        self.root = root
        self.records = RecordStore(f"sqlite:///{root / 'reef.db'}")
        self.chain = ReleaseChain(GitArtifactStore(state_dir=root, remote=remote), self.records, root / "releases")

    def follow(self, scenario: str):
        """What the follower does when the chain's head moved: fetch, reconcile, materialize the head."""
        self.chain.artifacts.heads()
        self.chain.reconcile([scenario])
        head = self.chain.head(scenario)
        return head, self.chain.materialize(head)


@pytest.fixture
def chain(tmp_path):
    """(publisher, follower, attacker): a good first release is published and followed."""
    remote = _bare(tmp_path / "remote.git")
    publisher, follower = _Follower(tmp_path / "a", remote), _Follower(tmp_path / "b", remote)
    art = tmp_path / "art"
    for rel, data in RULES.items():
        (art / rel).parent.mkdir(parents=True, exist_ok=True)
        (art / rel).write_bytes(data)
    publisher.chain.record(publisher.chain.publish("default", art, expected_head=None))
    follower.follow("default")
    yield publisher, follower, Attacker(tmp_path, remote)
    publisher.records.close()
    follower.records.close()


@pytest.mark.parametrize("case", [*MANIFEST_CASES, *RAW_MANIFESTS])
def test_a_hostile_manifest_is_refused_and_the_last_good_release_serves(chain, tmp_path, case, caplog):
    publisher, follower, attacker = chain
    good = follower.chain.head("default")
    manifest = _hostile_manifest(case, _next_manifest(attacker, "default", tmp_path / "next", RULES),
                                 _outside(tmp_path))
    pushed = attacker.push("default", manifest=manifest, files=_plain(RULES))
    ignore = (tmp_path / "remote.git", tmp_path / "attacker.git", tmp_path / "a", tmp_path / "b" / "artifacts.git")
    before = _snapshot(tmp_path, ignore)

    with caplog.at_level(logging.ERROR, logger="reef.commit"):
        for _ in range(3):  # the follower reads the moved head again each round
            head, served = follower.follow("default")

    assert _snapshot(tmp_path, ignore) == before, "the follower wrote outside its releases"
    assert not _outside(tmp_path).exists() and not (tmp_path / "escape").exists()
    assert head.release_id == good.release_id and served.path.parent.parent == tmp_path / "b" / "releases"
    assert [r.release_id for r in follower.records.list_releases("default")] == [good.release_id]
    refusal = follower.chain.refusals.get("default")
    assert refusal is not None and refusal.commit == pushed and refusal.position == 2
    assert f"release commit {pushed[:12]} of scenario 'default' is refused: " in refusal.reason
    logged = [r for r in caplog.records if "is refused" in r.getMessage()]
    assert len(logged) == 1, "a refusal is logged once, not at every round"
    assert f"keeps serving release {good.release_id}" in logged[0].getMessage()
    assert "\r" not in logged[0].getMessage() and "\n" not in logged[0].getMessage()


def test_releases_on_top_of_a_refused_one_are_refused_with_it(chain, tmp_path):
    _, follower, attacker = chain
    good = follower.chain.head("default")
    bad = _next_manifest(attacker, "default", tmp_path / "n1", RULES)
    pushed = attacker.push("default", manifest={**bad, "release_id": "../../x"}, files=_plain(RULES))
    on_top = {**_next_manifest(attacker, "default", tmp_path / "n2", RULES), "parent": "rel_looks_fine"}
    attacker.push("default", manifest=on_top, files=_plain(RULES))
    head, _ = follower.follow("default")
    assert head.release_id == good.release_id
    assert follower.chain.refusals.get("default").commit == pushed


#: tree entries no release may hold, with a well-formed manifest
TREE_CASES: dict[str, dict[str, tuple[str, bytes]]] = {
    "a link out": {"harness/skills": ("120000", b"@outside@")},
    "a link up": {"harness/evil.md": ("120000", b"../../../../escape")},
    "a submodule": {"harness/sub": ("160000", bytes.fromhex("0" * 40))},
    "a dot dot entry": {"harness/../../escape": ("100644", b"x")},
    "a dot file": {"harness/.hidden": ("100644", b"x")},
    "a line break in a name": {"harness/a\nb.md": ("100644", b"x")},
}


@pytest.mark.parametrize("case", TREE_CASES)
def test_a_release_whose_tree_is_hostile_is_never_checked_out(chain, tmp_path, case):
    _, follower, attacker = chain
    good = follower.chain.head("default")
    extra = {p: (mode, data.replace(b"@outside@", str(_outside(tmp_path)).encode()))
             for p, (mode, data) in TREE_CASES[case].items()}
    manifest = _next_manifest(attacker, "default", tmp_path / "next", RULES)
    pushed = attacker.push("default", manifest=manifest, files={**_plain(RULES), **extra})
    follower.chain.artifacts.heads()
    follower.chain.reconcile(["default"])
    head = follower.chain.head("default")
    assert head.git_commit == pushed  # its manifest is fine: recorded, and refused when served
    with pytest.raises(ArtifactError, match=f"release commit {pushed[:12]} of scenario 'default' is refused"):
        follower.chain.materialize(head)
    assert sorted(p.name for p in (tmp_path / "b" / "releases" / "default").iterdir()) == [good.release_id]
    assert not _outside(tmp_path).exists() and not (tmp_path / "escape").exists()


def test_what_reef_publishes_passes_every_check(chain, tmp_path):
    """Ids Reef makes (release and candidate ids, rollbacks) are what a follower accepts."""
    publisher, follower, _ = chain
    first = publisher.chain.head("default")
    art = tmp_path / "art2"
    (art / "harness" / "skills" / "a-b_c.d").mkdir(parents=True)
    (art / "harness" / "skills" / "a-b_c.d" / "SKILL.md").write_text("name: x\n")
    second = publisher.chain.record(publisher.chain.publish("default", art, expected_head=first.release_id,
                                                            candidate_id=new_id("cand")))
    third = publisher.chain.record(publisher.chain.rollback("default", first.release_id))
    head, served = follower.follow("default")
    assert [r.release_id for r in follower.records.list_releases("default", newest_first=False)] == \
        [first.release_id, second.release_id, third.release_id]
    assert head.release_id == third.release_id and served.path.name == third.release_id
    assert follower.chain.refusals.all() == {}


def test_a_scenario_name_that_cannot_be_a_directory_is_refused(chain, tmp_path):
    publisher, follower, attacker = chain
    with pytest.raises(ArtifactError, match="cannot publish a release of scenario '..'"):
        publisher.chain.publish("..", tmp_path / "art", expected_head=None)
    # pushed by hand: a ref whose name decodes to ".." (git itself refuses a ".." ref component)
    manifest = {**_next_manifest(attacker, "default", tmp_path / "n", RULES), "scenario": "..", "sequence": 1,
                "parent": None}
    commit = attacker.push("default", manifest=manifest, files=_plain(RULES))
    attacker.git("push", "-q", attacker.remote, f"{commit}:refs/reef/scenarios/%2E%2E")
    follower.chain.artifacts.heads()
    follower.chain.reconcile()
    assert follower.records.list_releases("..") == []
    assert "the scenario name '..' is not allowed" in follower.chain.refusals.get("..").reason
    assert sorted(p.name for p in (tmp_path / "b" / "releases").iterdir()) == ["default"]
    assert not (tmp_path / "b" / "escape").exists() and not (tmp_path / "escape").exists()


# ---------------------------------------------------------------------- a running server


def _ask(client) -> Any:
    return client.post("/v1/chat/completions", json={"model": "fake-model", "messages": [{"role": "user",
                                                                                           "content": "hi"}]})


SERVER_CASES = ["release_id up and out", "release_id absolute", "release_id CR LF", "manifest not JSON",
                "tree: a link out"]


@pytest.mark.parametrize("case", SERVER_CASES)
def test_a_following_server_keeps_answering_with_its_last_good_release(tmp_path, monkeypatch, case):
    monkeypatch.setattr(serving_module, "FOLLOW_INTERVAL_S", 0.05)
    remote = _bare(tmp_path / "remote.git")
    publisher, attacker = _Follower(tmp_path / "a", remote), Attacker(tmp_path, remote)
    art = tmp_path / "art"
    (art / "harness").mkdir(parents=True)
    (art / "harness" / "rules.md").write_bytes(RULES["harness/rules.md"])
    good = publisher.chain.record(publisher.chain.publish("default", art, expected_head=None))
    with FakeUpstream("openai") as up, \
            ReefServer(tmp_path / "b", [f"artifact_store.remote={remote}"], upstream=up, learning=False) as server:
        client = server.client()
        wait_for(lambda: _ask(client).headers.get("x-reef-release-id") == good.release_id, "the good release")
        ignore = (tmp_path / "remote.git", tmp_path / "attacker.git", tmp_path / "a",
                  tmp_path / "b" / "artifacts.git")
        manifest = _next_manifest(attacker, "default", tmp_path / "next", RULES)
        before = _snapshot(tmp_path, ignore)
        if case.startswith("tree: "):
            target = str(_outside(tmp_path)).encode()
            pushed = attacker.push("default", manifest=manifest,
                                   files={**_plain(RULES), "harness/skills": ("120000", target)})
        else:
            pushed = attacker.push("default", manifest=_hostile_manifest(case, manifest, _outside(tmp_path)),
                                   files=_plain(RULES))
        wait_for(lambda: server.reef.releases.refused("default") is not None, "the refusal")

        for _ in range(5):  # every answer is an HTTP answer with a receipt, from the last good release
            r = _ask(client)
            assert r.status_code == 200, r.text
            assert RECEIPT.match(r.headers["x-reef-agent-record-id"])
            assert r.headers["x-reef-release-id"] == good.release_id
            assert "x-injected" not in r.headers
        status = client.get("/reef/scenarios/default").json()
        assert status["serving_release_id"] == good.release_id
        assert status["refused_release"]["commit"] == pushed and "is refused" in status["refused_release"]["reason"]
        assert 'reef_release_refused{scenario="default"} 1.0' in client.get("/metrics").text
        assert _snapshot(tmp_path, ignore) == before and not _outside(tmp_path).exists()
        assert server.reef.releases.dead_tasks() == []

        # the way out, as docs/deploy.md says: a release whose tree was refused is recorded, so a
        # rollback goes on top of it (serving it again is refused: 409); one whose manifest was
        # refused is not, so the ref goes back to the last good release first
        rollback = "/reef/scenarios/default/rollback"
        if case.startswith("tree: "):
            refused = client.post(rollback, json={"release_id": server.store.head_release("default").release_id})
            assert refused.status_code == 409 and "is refused" in refused.json()["error"]["message"]
        else:
            assert client.post(rollback, json={"to": "base"}).status_code == 409  # the chain is not where it was
            subprocess.run(["git", f"--git-dir={tmp_path / 'remote.git'}", "update-ref",
                            scenario_ref("default"), good.git_commit], check=True)
            wait_for(lambda: server.reef.releases.refused("default") is None, "the refusal to settle")
        fixed = client.post(rollback, json={"to": "base"})
        assert fixed.status_code == 200 and fixed.json()["published"], fixed.text
        fixed_id = fixed.json()["release"]["release_id"]
        assert _ask(client).headers["x-reef-release-id"] == fixed_id
        assert server.reef.releases.refused("default") is None
        assert 'reef_release_refused{scenario="default"}' not in client.get("/metrics").text
    publisher.records.close()


@pytest.mark.parametrize("case", ["release_id up and out", "tree: a link out"])
def test_a_server_starting_on_a_refused_head_serves_the_last_good_release(tmp_path, case):
    remote = _bare(tmp_path / "remote.git")
    publisher, attacker = _Follower(tmp_path / "a", remote), Attacker(tmp_path, remote)
    art = tmp_path / "art"
    (art / "harness").mkdir(parents=True)
    (art / "harness" / "rules.md").write_bytes(RULES["harness/rules.md"])
    good = publisher.chain.record(publisher.chain.publish("default", art, expected_head=None))
    manifest = _next_manifest(attacker, "default", tmp_path / "next", RULES)
    if case.startswith("tree: "):
        attacker.push("default", manifest=manifest,
                      files={**_plain(RULES), "harness/skills": ("120000", str(_outside(tmp_path)).encode())})
    else:
        attacker.push("default", manifest=_hostile_manifest(case, manifest, _outside(tmp_path)), files=_plain(RULES))
    with FakeUpstream("openai") as up, \
            ReefServer(tmp_path / "b", [f"artifact_store.remote={remote}"], upstream=up, learning=False) as server:
        r = _ask(server.client())
        assert r.status_code == 200 and RECEIPT.match(r.headers["x-reef-agent-record-id"])
        assert r.headers["x-reef-release-id"] == good.release_id
        assert server.reef.releases.refused("default") is not None
    assert not _outside(tmp_path).exists() and not (tmp_path / "escape").exists()
    publisher.records.close()
