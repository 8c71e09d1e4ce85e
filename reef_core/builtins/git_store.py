"""The ``git`` artifact store: each scenario's release chain as commits on one ref.

Layout: a bare repository (``<state_dir>/artifacts.git`` unless ``path`` is set), one ref per
scenario (``refs/reef/scenarios/<name>``), one commit per release whose tree is the artifact
plus a ``reef-release.json`` manifest. Refs move only by compare-and-swap
(``git update-ref <ref> <new> <expected-old>``): a publisher whose expected head is stale
gets ``PublishConflict`` and nothing changes.

Binary files matching ``lfs_patterns`` go to Git LFS (objects under ``artifacts.git/lfs``).
Without the ``git-lfs`` program the store still works for text-only artifacts (harness
releases) and logs a warning once; publishing a file that needs LFS then fails with a clear
message instead of silently putting large binaries into git history.

Git runs hermetically (no system or global config), so a user's ``core.excludesFile`` or
hooks cannot change what a release contains.

A shared chain: with ``remote`` set (a ``file://``, ``http(s)://``, ``ssh://`` or ``git://``
URL), the local repository is a cache of that remote. Every read that can see another
server's releases (``heads``, ``scenarios``, ``head``) fetches the scenario refs first; a
publish pushes the new commit with ``--force-with-lease=<ref>:<expected>`` (the remote
moves the ref only if it still points at ``expected``), after pushing the commit's LFS
objects to the remote's LFS endpoint (``lfs_url`` when the git server has none). A lost race
is ``PublishConflict``; a remote that cannot be reached fails the publish with a clear error,
while reads keep serving from the cache and log a warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import git

from ..commit.artifacts import (
    MANIFEST,
    ArtifactError,
    StoredRelease,
    artifact_files,
    content_hash,
)
from ..commit.release_checks import ReleaseRefused, check_manifest, check_tree, parse_manifest
from ..contracts import ArtifactStore, refuse_bad_options
from ..errors import PublishConflict
from ..hookspecs import hookimpl

log = logging.getLogger("reef.commit")

REF_PREFIX = "refs/reef/scenarios/"
ZERO = "0" * 40
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
#: how often a publish tries to move a ref whose lock another git process holds, and the wait
#: between tries (git itself waits ``core.filesRefLockTimeout``, 100 ms, in each)
REF_LOCK_TRIES = 3
REF_LOCK_WAIT_S = 0.2

_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_AUTHOR_NAME": "Reef",
    "GIT_AUTHOR_EMAIL": "reef@localhost",
    "GIT_COMMITTER_NAME": "Reef",
    "GIT_COMMITTER_EMAIL": "reef@localhost",
}


def scenario_ref(scenario: str) -> str:
    """The ref of ``scenario``: its name with every character outside ``[A-Za-z0-9_-]``
    percent-encoded, so any scenario name makes a valid, reversible ref name."""
    return REF_PREFIX + quote(scenario, safe="").replace(".", "%2E").replace("~", "%7E")



@contextlib.contextmanager
def _process_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes (several servers initialising one shared
    repository at once would otherwise collide on git's ``config.lock``)."""
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)

class GitArtifactStore(ArtifactStore):
    """Release chains in a bare git repository, refs moved by compare-and-swap."""

    @classmethod
    def option_problems(cls, o: dict[str, Any]) -> list[str]:
        """The option values' problems (``reef config`` asks); the path is settled when built."""
        problems = []
        if o["lfs_url"] and not o["remote"]:
            problems.append("artifact_store.lfs_url needs artifact_store.remote (the LFS endpoint of that remote)")
        if not o["timeout_s"] > 0:
            problems.append("artifact_store.timeout_s must be above 0 (seconds)")
        return problems

    def __init__(self, path: str | None = None, lfs_patterns: list[str] | tuple[str, ...] = ("*.safetensors", "*.bin"),
                 state_dir: Path | None = None, remote: str | None = None, lfs_url: str | None = None,
                 timeout_s: float = 120.0):
        refuse_bad_options(type(self), locals())
        if path is None and state_dir is None:
            raise ValueError("artifact_store.path is required when no state directory is known")
        self.path = Path(path).expanduser().resolve() if path else Path(state_dir) / "artifacts.git"
        self.lfs_patterns = tuple(lfs_patterns)
        self.lfs_available = shutil.which("git-lfs") is not None
        #: URL of the shared repository this one caches (None: this repository is the chain)
        self.remote = _remote_url(remote) if remote else None
        self.lfs_url = _remote_url(lfs_url) if lfs_url else None
        self.timeout_s = float(timeout_s)
        self._init_lock = threading.Lock()
        self._fetch_lock = threading.Lock()
        self._remote_down_since: float | None = None
        self._ready = False
        self._manifests: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ plumbing

    def _git(self, *args: str, env: dict[str, str] | None = None, check: bool = True,
             timeout: float | None = None) -> tuple[int, str, str]:
        self._ensure_repo()
        full = dict(_ENV, **(env or {}))
        status, out, err = git.Git().execute(
            ["git", f"--git-dir={self.path}", *args], env=full,
            with_extended_output=True, with_exceptions=False, kill_after_timeout=timeout,
        )
        if check and status != 0:
            raise ArtifactError(f"git {args[0]} failed in {self.path}: {err.strip() or out.strip()}")
        return status, out, err

    def _ensure_repo(self) -> None:
        if self._ready:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._init_lock, _process_lock(self.path.parent / f".{self.path.name}.init-lock"):
            if self._ready:
                return
            if not (self.path / "HEAD").exists():
                git.Repo.init(self.path, bare=True, mkdir=True).close()
            wanted = {("gc", "auto"): "0"}
            if self.lfs_available:
                wanted.update({('filter "lfs"', "clean"): "git-lfs clean -- %f",
                               ('filter "lfs"', "smudge"): "git-lfs smudge -- %f",
                               ('filter "lfs"', "process"): "git-lfs filter-process",
                               ('filter "lfs"', "required"): "true"})
            if self.remote:
                wanted[('remote "origin"', "url")] = self.remote
                # a lease names the expected old value itself: no remote-tracking refs are needed
                wanted[('remote "origin"', "fetch")] = f"+{REF_PREFIX}*:{REF_PREFIX}*"
                if self.lfs_url:
                    wanted[("lfs", "url")] = self.lfs_url
                if (self.lfs_url or self.remote).startswith("file://"):
                    # git-lfs >= 3 picks this agent for file:// by itself; 2.x needs it named
                    wanted[("lfs", "standalonetransferagent")] = "lfs-standalone-file"
            try:
                repo = git.Repo(self.path)
            except (git.exc.InvalidGitRepositoryError, git.exc.NoSuchPathError):
                raise ArtifactError(
                    f"the artifact store {self.path} is not a git repository git can open (a damaged HEAD, "
                    f"objects/ or refs/; its HEAD holds {_head_text(self.path)}); restore it from a backup, or "
                    f"write 'ref: refs/heads/master' into {self.path / 'HEAD'} if only that file was damaged") from None
            try:
                reader = repo.config_reader("repository")
                # gitpython reads "0"/"true" back as 0/True, hence the comparison as lowercase text
                missing = {k: v for k, v in wanted.items() if _config_text(reader.get_value(*k, default="")) != v}
                if missing:  # under the process lock: servers starting together never race on config.lock
                    with repo.config_writer() as cw:
                        for (section, option), value in missing.items():
                            cw.set_value(section, option, value)
            finally:
                repo.close()
            info = self.path / "info"
            info.mkdir(exist_ok=True)
            attrs = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in self.lfs_patterns)
            (info / "attributes").write_text(attrs if self.lfs_available else "")
            if not self.lfs_available and self.lfs_patterns:
                log.warning("git-lfs is not installed: harness releases work, but publishing a file "
                            "matching %s will fail (install git-lfs to store adapters)",
                            ", ".join(self.lfs_patterns))
            self._ready = True

    def sync(self) -> bool:
        """Fetch the scenario refs from ``remote`` into this cache (pruning deleted ones); True
        when the cache is current. Without a remote there is nothing to fetch (True).

        A remote that cannot be reached leaves the cache as it is: reads serve what is known
        (a warning when the outage starts, another when it ends), publishing fails."""
        if not self.remote:
            return True
        with self._fetch_lock:
            status, out, err = self._git("fetch", "--prune", "--no-tags", "--quiet", "origin",
                                         check=False, timeout=self.timeout_s)
            if status == 0:
                if self._remote_down_since is not None:
                    log.warning("artifact store remote %s is reachable again", _redact(self.remote))
                    self._remote_down_since = None
                return True
            if self._remote_down_since is None:
                self._remote_down_since = time.monotonic()
                log.warning("cannot fetch releases from the artifact store remote %s (serving the local "
                            "cache until it answers): %s", _redact(self.remote), self._scrub(err or out))
            return False

    def read_manifest(self, commit: str) -> dict[str, Any]:
        """The manifest of release commit ``commit``."""
        return dict(self._manifest(commit))

    def _manifest(self, commit: str) -> dict[str, Any]:
        cached = self._manifests.get(commit)
        if cached is None:
            _, out, _ = self._git("cat-file", "blob", f"{commit}:{MANIFEST}")
            cached = parse_manifest(out)  # a release's manifest is untrusted: release_checks judges it
            self._manifests[commit] = cached
        return cached

    def _load_manifests(self, commits: list[str]) -> None:
        """Read the manifests of ``commits`` with one ``git cat-file --batch``."""
        if not commits:
            return
        with tempfile.TemporaryFile() as requests:
            requests.write("".join(f"{c}:{MANIFEST}\n" for c in commits).encode())
            requests.seek(0)
            self._ensure_repo()
            out = git.Git().execute(["git", f"--git-dir={self.path}", "cat-file", "--batch"], istream=requests,
                                    env=dict(_ENV), stdout_as_string=False, strip_newline_in_stdout=False)
        pos = 0
        for commit in commits:
            end = out.index(b"\n", pos)
            header = out[pos:end].decode().split()
            if len(header) != 3 or header[1] != "blob":  # "<name> missing": no manifest, refused when checked
                self._manifests[commit] = parse_manifest(None)
                pos = end + 1
                continue
            size = int(header[2])
            self._manifests[commit] = parse_manifest(out[end + 1:end + 1 + size])
            pos = end + 1 + size + 1

    def _resolve(self, scenario: str) -> str | None:
        status, out, _ = self._git("rev-parse", "-q", "--verify", scenario_ref(scenario) + "^{commit}", check=False)
        return out.strip() if status == 0 and out.strip() else None

    # ------------------------------------------------------------------ protocol

    def head(self, scenario: str) -> StoredRelease | None:
        """The scenario's newest release, or None before its first."""
        self.sync()
        commit = self._resolve(scenario)
        return StoredRelease(commit, self._manifest(commit)) if commit else None

    def history(self, scenario: str) -> list[StoredRelease]:
        """Every release of the scenario, newest first (the ref's first-parent chain)."""
        head = self._resolve(scenario)
        if head is None:
            return []
        _, out, _ = self._git("rev-list", "--first-parent", head)
        commits = out.split()
        self._load_manifests([c for c in commits if c not in self._manifests])
        return [StoredRelease(c, self._manifests[c]) for c in commits]

    def scenarios(self) -> list[str]:
        """Scenarios that have a release chain."""
        self.sync()
        _, out, _ = self._git("for-each-ref", "--format=%(refname)", REF_PREFIX)
        return sorted(unquote(line[len(REF_PREFIX):]) for line in out.splitlines() if line.strip())

    def heads(self) -> dict[str, str]:
        """{scenario: head commit} of every chain, in one git call (polled to follow other writers;
        with a remote, one fetch first)."""
        self.sync()
        _, out, _ = self._git("for-each-ref", "--format=%(objectname) %(refname)", REF_PREFIX)
        heads = {}
        for line in out.splitlines():
            commit, _, ref = line.strip().partition(" ")
            if ref.startswith(REF_PREFIX):
                heads[unquote(ref[len(REF_PREFIX):])] = commit
        return heads

    def publish(self, scenario: str, artifact_dir: Path, manifest: dict[str, Any], *,
                expected_head: str | None) -> StoredRelease:
        """Commit ``artifact_dir`` + ``manifest`` on top of ``expected_head`` and move the
        scenario's ref to it by compare-and-swap. ``expected_head`` None: the chain must be empty.

        Raises PublishConflict when the ref is not at ``expected_head`` any more.
        """
        files = artifact_files(artifact_dir)
        self._check_lfs(files)
        with tempfile.TemporaryDirectory(prefix="reef-publish-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(Path(artifact_dir).resolve())}
            if files:
                self._git("add", "-A", "--", *[rel for rel, _ in files], env=env)
            manifest_file = Path(tmp) / MANIFEST
            manifest_file.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            _, blob, _ = self._git("hash-object", "-w", str(manifest_file))
            self._git("update-index", "--add", "--cacheinfo", f"100644,{blob.strip()},{MANIFEST}", env=env)
            _, tree, _ = self._git("write-tree", env=env)
        parents = ["-p", expected_head] if expected_head else []
        message = f"{manifest.get('operation', 'train')} {manifest['release_id']} ({scenario})"
        _, commit, _ = self._git("commit-tree", tree.strip(), *parents, "-m", message)
        commit = commit.strip()
        if self.remote:
            self._push(scenario, commit, expected_head)
            self._git("update-ref", "-m", message, scenario_ref(scenario), commit)
            self._manifests[commit] = dict(manifest)
            return StoredRelease(commit, dict(manifest))
        self._move_ref(scenario, commit, expected_head, message)
        self._manifests[commit] = dict(manifest)
        return StoredRelease(commit, dict(manifest))

    def _move_ref(self, scenario: str, commit: str, expected_head: str | None, message: str) -> None:
        """``git update-ref`` by compare-and-swap: PublishConflict when the ref moved away from
        ``expected_head``. A ref that did not move but could not be locked (another git process
        holds ``<ref>.lock`` past git's own wait, or a killed one left it behind) is retried for
        a moment, then an ArtifactError naming the lock: no conflict, which would send the step
        to retry its batch at once, over and over, against a head that never moved."""
        ref = scenario_ref(scenario)
        for attempt in range(REF_LOCK_TRIES):
            status, out, err = self._git("update-ref", "-m", message, ref, commit, expected_head or ZERO, check=False)
            if status == 0:
                return
            actual = self._resolve(scenario)
            if actual == commit:  # cannot happen (a new commit), but then the swap did land
                return
            if actual != expected_head:
                raise PublishConflict(
                    f"scenario {scenario!r} moved since its head was read (by another server or command): expected head "
                    f"{expected_head or 'none'}, found {actual or 'none'}; nothing was published"
                )
            if attempt + 1 < REF_LOCK_TRIES:
                time.sleep(REF_LOCK_WAIT_S)
        why = (err or out).strip().splitlines()[0] if (err or out).strip() else f"exit status {status}"
        lock = self.path / f"{ref}.lock"
        hint = (f"; if no git process is working on {self.path}, a crashed one left {lock} behind: remove it"
                if lock.exists() else "")
        raise ArtifactError(f"could not move the release chain of {scenario!r} (its head did not move, nothing was "
                            f"published): {why}{hint}")

    def _push(self, scenario: str, commit: str, expected_head: str | None) -> None:
        """Move the remote's scenario ref from ``expected_head`` to ``commit`` (compare-and-swap
        by lease), after its LFS objects reached the remote's LFS endpoint. LFS objects are
        content-addressed, so a push that then loses the race leaves only unreferenced objects."""
        ref = scenario_ref(scenario)
        if self.lfs_available:
            _, listed, _ = self._git("lfs", "ls-files", "--long", commit)
            oids = [line.split()[0] for line in listed.splitlines() if line.strip()]
            if oids:
                status, out, err = self._git("lfs", "push", "--object-id", "origin", *oids, check=False,
                                             timeout=self.timeout_s)
                if status != 0:
                    raise ArtifactError(f"pushing LFS objects to {_redact(self.lfs_url or self.remote)} failed; "
                                        f"nothing was published: {self._scrub(err or out)}")
        # --no-verify: the LFS objects went above, no hook of this repository runs
        status, out, err = self._git("push", "--porcelain", "--no-verify", f"--force-with-lease={ref}:{expected_head or ''}",
                                     "origin", f"{commit}:{ref}", check=False, timeout=self.timeout_s)
        if status == 0:
            return
        # rejected or failed: a conflict exactly when the remote's ref is no longer the expected head
        fetched = self.sync()
        actual = self._resolve(scenario)
        if fetched and actual == commit:  # the push landed, only its answer was lost
            return
        if fetched and actual != expected_head:
            raise PublishConflict(
                f"scenario {scenario!r} moved on {_redact(self.remote)} since its head was read: "
                f"expected head {expected_head or 'none'}, found {actual or 'none'}; nothing was published")
        raise ArtifactError(f"pushing release {commit[:12]} of {scenario!r} to {_redact(self.remote)} failed; "
                            f"nothing was published: {self._scrub(err or out)}")

    def _scrub(self, text: str) -> str:
        """git's own message, without the passwords of the remote URLs (git may quote them)."""
        text = text.strip()
        for url in (self.remote, self.lfs_url):
            password = urlsplit(url or "").password
            if password:
                text = text.replace(password, "***")
        return text

    def materialize(self, scenario: str, commit: str, dest: Path) -> Path:
        """Write the tree of release ``commit`` into the new directory ``dest`` and check that
        its content hash matches the manifest (a damaged store or missing LFS object fails)."""
        try:  # nothing of a refused release is written
            manifest = check_manifest(self._manifest(commit), scenario=scenario)
            self._check_tree(commit)
        except ReleaseRefused as exc:
            raise ReleaseRefused.of(scenario, commit, exc) from None
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=False)
        with tempfile.TemporaryDirectory(prefix="reef-checkout-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index"), "GIT_WORK_TREE": str(dest.resolve())}
            self._git("read-tree", commit, env=env)
            self._git("checkout-index", "-a", "-f", env=env)
        got = content_hash(dest)
        if got != manifest["content_hash"]:
            raise ArtifactError(f"release {manifest['release_id']} of {scenario!r} materialized with content "
                                f"hash {got}, but its manifest says {manifest['content_hash']}; the artifact "
                                f"store at {self.path} is damaged or an LFS object is missing")
        return dest

    def _check_tree(self, commit: str) -> None:
        """Refuse a commit whose tree holds anything but plain files with allowed names
        (``release_checks.check_tree``), before any of it is checked out."""
        _, out, _ = self._git("ls-tree", "-r", "-z", "--full-tree", commit)
        entries = []
        for line in out.split("\0"):
            if line:
                meta, _, path = line.partition("\t")
                if path != MANIFEST:
                    entries.append((meta.split(" ", 1)[0], path))
        check_tree(entries)

    def diff(self, old_commit: str | None, new_commit: str) -> str:
        """Unified diff of the artifact files between two releases (None: the empty tree)."""
        _, out, _ = self._git("diff", "--no-color", "--no-ext-diff", "--no-textconv",
                              old_commit or EMPTY_TREE, new_commit, "--", ".", f":(exclude){MANIFEST}")
        return out

    def _check_lfs(self, files: list[tuple[str, Path]]) -> None:
        if self.lfs_available:
            return
        for rel, _ in files:
            name = rel.rsplit("/", 1)[-1]
            if any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(rel, p) for p in self.lfs_patterns):
                raise ArtifactError(f"artifact file {rel!r} must be stored with Git LFS, but git-lfs is not "
                                    "installed; install it (e.g. apt-get install git-lfs) and retry")


def _remote_url(value: str) -> str:
    """``value`` as a URL git understands; a plain local path becomes a ``file://`` URL (the
    transport git-lfs's standalone file agent needs)."""
    value = str(value).strip()
    if "://" in value or (":" in value and not value.startswith(("/", ".", "~"))):  # scp-like user@host:path
        return value
    return Path(value).expanduser().resolve().as_uri()


def _redact(url: str | None) -> str:
    """``url`` without a password, for messages and logs."""
    parts = urlsplit(url or "")
    if not parts.password:
        return url or ""
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def _head_text(path: Path) -> str:
    """What ``path``'s HEAD file holds, for a message."""
    try:
        text = (path / "HEAD").read_bytes()[:60]
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return repr(text.decode(errors="replace")) if text else "nothing"


def _config_text(value: Any) -> str:
    """A value gitpython read back (it turns "true" and "0" into True and 0) as git writes it."""
    return str(value).lower() if isinstance(value, (bool, int)) else str(value)


@hookimpl
def register_artifact_stores(register: Any) -> None:
    register("git", GitArtifactStore)
