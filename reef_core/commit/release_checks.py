"""Releases are untrusted input: what a release read from the chain must be before a server
records it, writes it to disk or names it in a response.

Whoever can push to the artifact store (its remote, with several servers) can put any commit
on a scenario's ref, and every server following the chain reads it. Nothing a release says
may choose where a server writes or what it sends in a header, so each one is checked:

- ids (``release_id``, ``parent``, ``candidate_id``, ``rollback_to``, ``operation``) are
  letters, digits, ``_`` and ``-``, starting with a letter or digit, no longer than the
  database column (``new_id`` makes ``rel_`` and ``cand_`` plus 32 hex digits);
- the manifest's ``scenario`` is the scenario whose chain holds it; a scenario name is 1-200
  characters without control characters and is not ``.`` or ``..`` (it names a directory);
- ``sequence`` and ``parent`` continue the chain (1, 2, ...; each parent the release before);
- ``content_hash`` and the ``files`` checksums are SHA-256 hex digests, and file names follow
  ``check_path``, the rule the agent harness installer holds every path to;
- a release's tree holds plain files only (``check_tree``): no symbolic link, no submodule.

A release that fails is refused (``ReleaseRefused``): it is not recorded and never served,
and the releases after it in the chain are refused with it, since they build on it. The
scenario keeps serving its last good release; ``Refusals`` logs each refusal once and keeps
the newest one per scenario for ``GET /reef/scenarios/{s}`` and ``/metrics``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .artifacts import MANIFEST, ArtifactError, StoredRelease, check_path

log = logging.getLogger("reef.commit")

#: an id read from a release: no dot, slash, space or control character can pass
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")
#: longest release id (and parent, rollback target), candidate id and operation: the columns
MAX_RELEASE_ID = 100
MAX_CANDIDATE_ID = 64
MAX_OPERATION = 16
#: longest scenario name (the column)
MAX_SCENARIO = 200
SHA256 = re.compile(r"[0-9a-f]{64}\Z")
#: git modes of the files a release tree may hold (directories are walked, not listed)
FILE_MODES = frozenset({"100644", "100755"})
#: the key ``parse_manifest`` answers with when a commit has no readable manifest
UNREADABLE = "reef_unreadable_manifest"

_ID_RULE = "letters, digits, '_' and '-', starting with a letter or digit"
_SHOWN = 80  # characters of a refused value quoted in a message


class ReleaseRefused(ArtifactError):
    """A release read from the chain breaks a rule above; it is never recorded nor served."""

    @classmethod
    def of(cls, scenario: str, commit: str, reason: ReleaseRefused | str) -> ReleaseRefused:
        """The refusal of release commit ``commit`` of ``scenario`` for ``reason``, as logged."""
        return cls(f"release commit {commit[:12]} of scenario {_shown(scenario)} is refused: {reason}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def check_id(value: Any, what: str, *, max_length: int = MAX_RELEASE_ID) -> str:
    """``value`` if it is an id (see the module docstring), else ``ReleaseRefused`` naming ``what``."""
    if not isinstance(value, str) or len(value) > max_length or not ID.match(value):
        raise ReleaseRefused(f"its {what} {_shown(value)} is not an id ({_ID_RULE}; at most {max_length})")
    return value


def check_scenario(name: Any) -> str:
    """``name`` if it can be a scenario's directory and database row (see the module docstring)."""
    if not isinstance(name, str) or not name or len(name) > MAX_SCENARIO or name in (".", ".."):
        raise ReleaseRefused(f"the scenario name {_shown(name)} is not allowed (1-{MAX_SCENARIO} characters, "
                             "not '.' or '..')")
    if any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in name):
        raise ReleaseRefused(f"the scenario name {_shown(name)} holds a control character or line break")
    return name


def _optional_id(manifest: dict[str, Any], key: str, max_length: int = MAX_RELEASE_ID) -> None:
    if manifest.get(key) is not None:
        check_id(manifest[key], key, max_length=max_length)


def check_manifest(manifest: Any, *, scenario: str, sequence: int | None = None,
                   parent: str | None = None) -> dict[str, Any]:
    """``manifest`` if it is a well-formed manifest of a release of ``scenario``; with
    ``sequence`` (and ``parent``, None for the first), also that it is that link of the chain.
    ``ReleaseRefused`` says what is wrong."""
    if not isinstance(manifest, dict):
        raise ReleaseRefused(f"its {MANIFEST} is not a JSON object")
    if UNREADABLE in manifest:
        raise ReleaseRefused(str(manifest[UNREADABLE]))
    check_id(manifest.get("release_id"), "release_id")
    if manifest.get("scenario") != scenario:
        raise ReleaseRefused(f"its manifest names scenario {_shown(manifest.get('scenario'))}, but it is in "
                             f"the chain of {scenario!r}")
    _optional_id(manifest, "parent")
    _optional_id(manifest, "candidate_id", MAX_CANDIDATE_ID)
    _optional_id(manifest, "rollback_to")
    check_id(manifest.get("operation", "train"), "operation", max_length=MAX_OPERATION)
    number = manifest.get("sequence")
    if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number < 2**63:
        raise ReleaseRefused(f"its sequence {_shown(number)} is not a positive integer")
    if sequence is not None and (number != sequence or manifest.get("parent") != parent):
        raise ReleaseRefused(f"it says it is release {number} after {_shown(manifest.get('parent'))}, but it "
                             f"follows release {sequence - 1} ({parent or 'none'}) in the chain")
    if not isinstance(manifest.get("content_hash"), str) or not SHA256.match(manifest["content_hash"]):
        raise ReleaseRefused(f"its content_hash {_shown(manifest.get('content_hash'))} is not a SHA-256 hex digest")
    files = manifest.get("files", {})
    if not isinstance(files, dict):
        raise ReleaseRefused("its files are not a JSON object")
    for name, digest in files.items():
        try:
            check_path(name)
        except ArtifactError as exc:
            raise ReleaseRefused(f"it lists a file that cannot be written: {exc}") from None
        if not isinstance(digest, str) or not SHA256.match(digest):
            raise ReleaseRefused(f"its checksum of {name!r} is not a SHA-256 hex digest")
    if manifest.get("evaluation") is not None and not isinstance(manifest["evaluation"], dict):
        raise ReleaseRefused("its evaluation is not a JSON object")
    return manifest


def parse_manifest(raw: bytes | str | None) -> dict[str, Any]:
    """A manifest read from a store: the JSON object, or ``{UNREADABLE: why}`` (which
    ``check_manifest`` refuses) when it is missing or no JSON object, so that one unreadable
    commit refuses that release instead of failing every read of its chain."""
    if raw is None:
        return {UNREADABLE: f"it has no {MANIFEST}"}
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return {UNREADABLE: f"its {MANIFEST} is not JSON ({str(exc)[:_SHOWN]})"}
    return manifest if isinstance(manifest, dict) else {UNREADABLE: f"its {MANIFEST} is not a JSON object"}


def check_tree(entries: Iterable[tuple[str, str]]) -> None:
    """Refuse a release tree, listed as (git mode, path) of every non-directory entry, that
    holds anything but plain files with allowed names (a symbolic link, a submodule, a path
    ``check_path`` refuses)."""
    for mode, path in entries:
        try:
            check_path(path)
        except ArtifactError as exc:
            raise ReleaseRefused(f"its tree holds a file that cannot be written: {exc}") from None
        if mode not in FILE_MODES:
            kind = {"120000": "a symbolic link", "160000": "a submodule"}.get(mode, f"an entry of mode {mode}")
            raise ReleaseRefused(f"its tree holds {kind} at {path!r}; releases hold plain files only")


def check_publishable(scenario: str, manifest: dict[str, Any]) -> None:
    """What Reef is about to publish passes the checks every follower makes (a scenario name
    that cannot pass is refused here, before anything is published)."""
    try:
        check_manifest(manifest, scenario=check_scenario(scenario))
    except ReleaseRefused as exc:
        raise ReleaseRefused(f"cannot publish a release of scenario {_shown(scenario)}: {exc}") from None


def check_served(release: Any) -> None:
    """The scenario and release id of ``release`` (a database row, a stored release) before
    they become a directory and a response header; ``ReleaseRefused`` otherwise."""
    try:
        check_scenario(release.scenario)
        check_id(release.release_id, "release_id")
    except ReleaseRefused as exc:
        raise ReleaseRefused(f"release {_shown(release.release_id)} of scenario {_shown(release.scenario)} is "
                             f"refused: {exc}") from None


def trusted_history(scenario: str, history: list[StoredRelease], refusals: Refusals) -> list[StoredRelease]:
    """The releases of ``scenario``'s ``history`` (oldest first) that pass every check: the
    chain up to its first refused release. A refusal is
    noted in ``refusals``; a chain that passes whole settles the scenario's earlier refusal
    when the refused commit left the chain (the ref was reset to a good release)."""
    good: list[StoredRelease] = []
    try:
        check_scenario(scenario)
    except ReleaseRefused as exc:
        if history:
            refusals.refuse(scenario, history[-1].commit, str(ReleaseRefused.of(scenario, history[-1].commit, exc)),
                            position=1, last_good=None)
        return good
    for stored in history:
        try:
            check_manifest(stored.manifest, scenario=scenario, sequence=len(good) + 1,
                           parent=good[-1].release_id if good else None)
        except ReleaseRefused as exc:
            refusals.refuse(scenario, stored.commit, str(ReleaseRefused.of(scenario, stored.commit, exc)),
                            position=len(good) + 1, last_good=good[-1].release_id if good else None)
            return good
        good.append(stored)
    refusals.settle(scenario, {s.commit for s in history})
    return good


@dataclass(frozen=True)
class Refusal:
    """A release this process refused: where in the chain, why, since when."""

    scenario: str
    commit: str
    #: the link of the chain it would have been (the releases before it, plus one)
    position: int
    reason: str
    since: str

    def to_json(self) -> dict[str, Any]:
        return {"commit": self.commit, "position": self.position, "reason": self.reason, "since": self.since}


class Refusals:
    """The newest refused release of each scenario, logged once per commit.

    A refusal stays while the scenario's chain still ends in it; it goes when the scenario
    serves a later link of its chain (``served``) or the refused commit left the chain
    (``settle``: the ref was reset to a good release)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_scenario: dict[str, Refusal] = {}
        self._logged: set[tuple[str, str]] = set()

    def refuse(self, scenario: str, commit: str, reason: str, *, position: int, last_good: str | None) -> Refusal:
        refusal = Refusal(scenario=scenario, commit=commit, position=position, reason=reason,
                          since=datetime.now(timezone.utc).isoformat())
        with self._lock:
            known = self._by_scenario.get(scenario)
            if known is not None and known.commit == commit and known.reason == reason:
                return known
            self._by_scenario[scenario] = refusal
            first = (scenario, commit) not in self._logged
            self._logged.add((scenario, commit))
        if first:
            log.error("%s; the scenario keeps serving %s. Publish a good release to move on (see docs/deploy.md, "
                      "'Releases are untrusted input')", reason,
                      f"release {last_good}" if last_good else "its last good release")
        return refusal

    def served(self, scenario: str, sequence: int, commit: str | None) -> None:
        """``scenario`` now serves release ``sequence`` (``commit``): a refusal of an earlier or
        the same link of the chain, other than that very commit, is settled."""
        with self._lock:
            known = self._by_scenario.get(scenario)
            if known is not None and sequence >= known.position and commit != known.commit:
                del self._by_scenario[scenario]

    def settle(self, scenario: str, chain: set[str]) -> None:
        """The chain of ``scenario`` (its commits) passed every check: a refusal of a commit
        that is no longer in it is settled."""
        with self._lock:
            known = self._by_scenario.get(scenario)
            if known is not None and known.commit not in chain:
                del self._by_scenario[scenario]

    def get(self, scenario: str) -> Refusal | None:
        with self._lock:
            return self._by_scenario.get(scenario)

    def all(self) -> dict[str, Refusal]:
        with self._lock:
            return dict(self._by_scenario)
