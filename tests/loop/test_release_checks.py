"""The rules a release read from the chain must pass (``reef_core.commit.release_checks``), as
properties: whatever they accept is safe to use as a directory name, a file path and a header
value, and any other value — of any JSON type, in any manifest field — is refused with
``ReleaseRefused``, never another exception."""

from __future__ import annotations

import posixpath
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reef_core.commit.artifacts import check_path
from reef_core.commit.release_checks import (
    MAX_RELEASE_ID,
    ReleaseRefused,
    check_id,
    check_manifest,
    check_scenario,
    check_tree,
    parse_manifest,
)
from reef_core.store import new_id

fast = settings(max_examples=300, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

BASE = "/state/releases/s"
#: pieces an attacker strings together: traversal, separators, line breaks, NUL, odd spaces
HOSTILE = st.sampled_from(["..", ".", "/", "\\", "\r", "\n", "\r\n", "\x00", "\u2028", "\u0085", " ", "%2e", "~",
                           "rel_", "a", "Z", "9", "-", "_", ":", "@", "+", "\t", "é", "\x7f"])
HOSTILE_TEXT = st.one_of(st.text(max_size=40), st.lists(HOSTILE, max_size=12).map("".join),
                         st.text(alphabet="ab_-.", min_size=95, max_size=110))
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | HOSTILE_TEXT,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(HOSTILE_TEXT, inner, max_size=3),
                    max_leaves=8)


def _one_name_inside(value: str) -> bool:
    """``value`` joined to ``BASE`` names exactly one new entry directly inside it."""
    joined = posixpath.normpath(posixpath.join(BASE, value))
    return joined == f"{BASE}/{value}" and "\\" not in value


def _header_safe(value: str) -> bool:
    return value.isascii() and value.isprintable()


@fast
@given(HOSTILE_TEXT)
@example("../../escape")
@example("/tmp/abs")
@example("a\r\nX-Injected: 1")
def test_an_accepted_id_is_one_plain_name_and_a_valid_header_value(value):
    try:
        check_id(value, "release_id")
    except ReleaseRefused as exc:
        assert "release_id" in str(exc) and "\n" not in str(exc) and "\r" not in str(exc)
        return
    assert _one_name_inside(value) and _header_safe(value) and len(value) <= MAX_RELEASE_ID


@pytest.mark.parametrize("prefix", ["rel", "cand", "rpt", "rec"])
def test_the_ids_reef_makes_are_accepted(prefix):
    for _ in range(200):
        assert check_id(new_id(prefix), "id")


@fast
@given(HOSTILE_TEXT)
@example("..")
@example(".")
@example("x/../y")
@example("a\nb")
def test_an_accepted_scenario_name_is_one_directory_inside_the_releases(name):
    try:
        check_scenario(name)
    except ReleaseRefused:
        return
    assert _one_name_inside(quote(name, safe="")) and "\n" not in name and "\r" not in name


def _good() -> dict:
    return {"format": "reef-release/1", "scenario": "s", "release_id": new_id("rel"), "sequence": 2,
            "parent": new_id("rel"), "content_hash": "a" * 64, "files": {"harness/rules.md": "b" * 64},
            "operation": "train", "candidate_id": new_id("cand"), "evaluation": {"metrics": {}},
            "rollback_to": None, "created_at": "2026-01-01T00:00:00+00:00"}


FIELDS = sorted(_good()) + ["unknown"]


@fast
@given(st.sampled_from(FIELDS), JSON, st.dictionaries(HOSTILE_TEXT, st.just("c" * 64), max_size=3))
def test_any_value_in_any_manifest_field_is_accepted_only_when_safe(field, value, files):
    """Schema-driven: each field of a good manifest replaced by any JSON value (and the file
    list by hostile names) is refused, or everything a server would use from it is safe."""
    manifest = {**_good(), field: value}
    if field != "files":
        manifest["files"] = {**manifest["files"], **files}
    try:
        check_manifest(manifest, scenario="s")
    except ReleaseRefused as exc:
        assert "\n" not in str(exc) and "\r" not in str(exc)
        return
    for key in ("release_id", "parent", "candidate_id", "rollback_to", "operation"):
        if manifest.get(key) is not None:
            assert _one_name_inside(manifest[key]) and _header_safe(manifest[key]), key
    assert manifest["scenario"] == "s" and isinstance(manifest["sequence"], int)
    for name in manifest["files"]:
        assert all(_one_name_inside(part) and not part.startswith(".") for part in name.split("/")), name


@fast
@given(st.lists(st.tuples(st.sampled_from(["100644", "100755", "120000", "160000", "040000", "644"]),
                          st.lists(HOSTILE_TEXT, min_size=1, max_size=4).map("/".join)), max_size=4))
def test_an_accepted_tree_holds_plain_files_with_plain_names(entries):
    try:
        check_tree(entries)
    except ReleaseRefused:
        return
    for mode, path in entries:
        assert mode in ("100644", "100755") and check_path(path) == path
        assert all(_one_name_inside(part) and not part.startswith(".") for part in path.split("/"))


@fast
@given(st.binary(max_size=200) | JSON.map(lambda v: __import__("json").dumps(v).encode()))
@example(b"[" * 100_000)
def test_a_manifest_that_is_no_json_object_is_refused_not_an_error(raw):
    manifest = parse_manifest(raw)
    assert isinstance(manifest, dict)
    with pytest.raises(ReleaseRefused):
        check_manifest(manifest, scenario="s")
