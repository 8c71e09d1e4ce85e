"""The ``files`` harness installer never writes or removes outside DEST.

The prune step removes what the previous install's ``.reef-harness.sha256`` lists, and that
file is local: anyone who can write DEST can edit it. The installer refuses the whole install
(exit 1, nothing changed) when any manifest it reads — that one or its own payload — names
an absolute path, a ``..``/``.``/empty part or odd characters, or when a path goes through a
symbolic link inside DEST; ``REEF_HARNESS_FORCE=1`` does not lift that. Each test runs the
generated script with every POSIX shell at hand.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from reef_core.builtins.harness_files import FilesAdapter
from reef_core.commit.artifacts import ArtifactError
from reef_core.commit.harness import HarnessBundle, HarnessFile

SHELLS = [s for s in ("sh", "dash", "bash") if shutil.which(s)]
V1 = {"rules.md": "- one\n", "skills/a/SKILL.md": "name: a\n", "system.md": "You help.\n"}
V2 = {"rules.md": "- two\n", "skills/b/SKILL.md": "name: b\n"}  # drops skills/a and system.md


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _script(tmp_path: Path, release_id: str, files: dict[str, str]) -> Path:
    bundle = HarnessBundle(scenario="s", release_id=release_id, content_hash="c" * 64, files=tuple(
        HarnessFile(path=p, data=d.encode(), sha256=_sha(d.encode())) for p, d in sorted(files.items())))
    path = tmp_path / f"install-{release_id}.sh"
    path.write_text(FilesAdapter().render(bundle))
    return path


def _run(shell: str, script: Path, dest: Path, *, force: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "REEF_HARNESS_FORCE": "1" if force else "0"}
    return subprocess.run([shell, str(script), str(dest)], capture_output=True, text=True, env=env, timeout=60)


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: file contents, and link targets (not followed)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = p.read_text()
    return out


@pytest.fixture
def installed(tmp_path):
    """(dest, v2 installer): release 1 installed in ``tmp/dest``, release 2's installer ready."""
    dest = tmp_path / "dest"
    first = _run("sh", _script(tmp_path, "rel_1", V1), dest)
    assert first.returncode == 0, first.stderr
    return dest, _script(tmp_path, "rel_2", V2)


def test_an_upgrade_prunes_dropped_files_inside_dest(installed):
    dest, v2 = installed
    for shell in SHELLS:
        r = _run(shell, v2, dest)
        assert r.returncode == 0, r.stderr
        assert _snapshot(dest) == {
            ".reef-harness-release": "release_id=rel_2\ncontent_hash=" + "c" * 64 + "\nscenario=s\n",
            ".reef-harness.sha256": "".join(f"{_sha(d.encode())}  {p}\n" for p, d in sorted(V2.items())),
            "rules.md": "- two\n", "skills/b/SKILL.md": "name: b\n"}
        assert not (dest / "skills" / "a" / "SKILL.md").exists()
        shutil.rmtree(dest)
        assert _run(shell, _script(dest.parent, "rel_1", V1), dest).returncode == 0


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("bad", ["../victim", "a/../../victim", "ABSOLUTE", "./../victim", "skills//../../victim",
                                 "skills/a/../../../victim"])
def test_a_tampered_old_manifest_cannot_reach_outside_dest(installed, tmp_path, shell, force, bad):
    dest, v2 = installed
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    bad = str(victim) if bad == "ABSOLUTE" else bad
    manifest = dest / ".reef-harness.sha256"
    # with the victim's real checksum the old installer's "changed locally?" check passed too
    manifest.write_text(manifest.read_text() + f"{_sha(victim.read_bytes())}  {bad}\n")
    before = _snapshot(dest)
    r = _run(shell, v2, dest, force=force)
    assert victim.exists() and victim.read_text() == "precious\n"
    assert r.returncode == 1
    assert "lists the unsafe path" in r.stderr and ".reef-harness.sha256" in r.stderr
    assert "nothing was changed" in r.stderr
    assert _snapshot(dest) == before


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("force", [False, True])
def test_a_symlinked_directory_in_dest_is_not_followed(installed, tmp_path, shell, force):
    dest, v2 = installed
    outside = tmp_path / "outside"
    (outside / "a").mkdir(parents=True)
    (outside / "a" / "SKILL.md").write_text("name: a\n")  # same content: looks like the installed file
    shutil.rmtree(dest / "skills")
    (dest / "skills").symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    r = _run(shell, v2, dest, force=force)
    assert r.returncode == 1 and "is a symbolic link" in r.stderr and "nothing was changed" in r.stderr
    assert _snapshot(outside) == before  # skills/a was not pruned through the link, skills/b not written
    assert (dest / "rules.md").read_text() == "- one\n"


@pytest.mark.parametrize("shell", SHELLS)
def test_a_symlinked_file_in_dest_is_not_followed(installed, tmp_path, shell):
    dest, v2 = installed
    target = tmp_path / "target"
    target.write_text("- one\n")  # same content as the installed rules.md
    (dest / "rules.md").unlink()
    (dest / "rules.md").symlink_to(target)
    r = _run(shell, v2, dest, force=True)
    assert r.returncode == 1 and "rules.md is a symbolic link" in r.stderr
    assert target.read_text() == "- one\n"


@pytest.mark.parametrize("shell", SHELLS)
def test_links_planted_at_temporary_and_bookkeeping_names_are_replaced_not_followed(installed, tmp_path, shell):
    dest, v2 = installed
    victims = {name: tmp_path / f"victim-{i}" for i, name in
               enumerate(["rules.md.reef-tmp", ".reef-harness-release", ".reef-harness.sha256.reef-tmp"])}
    for name, victim in victims.items():
        victim.write_text("precious\n")
        (dest / name).unlink(missing_ok=True)
        (dest / name).symlink_to(victim)
    r = _run(shell, v2, dest)
    assert r.returncode == 0, r.stderr
    assert all(v.read_text() == "precious\n" for v in victims.values())
    assert not (dest / "rules.md").is_symlink() and (dest / "rules.md").read_text() == "- two\n"
    assert not (dest / ".reef-harness-release").is_symlink()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_tampered_payload_path_is_refused_before_anything_is_written(tmp_path, shell):
    script = _script(tmp_path, "rel_1", {"rules.md": "- one\n"})
    text = script.read_text()
    assert text.count("  rules.md'") == 1
    script.write_text(text.replace("  rules.md'", "  ../escape'"))
    dest = tmp_path / "dest"
    r = _run(shell, script, dest)
    assert r.returncode == 1 and "this installer lists the unsafe path '../escape'" in r.stderr
    assert not dest.exists() and not (tmp_path / "escape").exists()


def test_a_bundle_with_a_bad_path_is_not_rendered():
    for bad in ("../x", "/etc/x", "a//b", "a/./b", ".hidden", "a b", "a\nb"):
        bundle = HarnessBundle(scenario="s", release_id="rel_1", content_hash="c",
                               files=(HarnessFile(path=bad, data=b"x\n", sha256=_sha(b"x\n")),))
        with pytest.raises(ArtifactError, match="unsafe file path"):
            FilesAdapter().render(bundle)


# ---------------------------------------------------------------------------- the shape of DEST


@pytest.mark.parametrize("shell", SHELLS)
def test_a_release_that_turns_a_file_into_a_directory_installs(tmp_path, shell):
    """Release 1 has ``skills/foo`` as a file, release 2 a skill directory of that name: the file
    release 1 installed is removed first, so the directory can be made (it failed every time)."""
    dest = tmp_path / "dest"
    assert _run(shell, _script(tmp_path, "rel_1", {"skills/foo": "a file\n"}), dest).returncode == 0
    r = _run(shell, _script(tmp_path, "rel_2", {"skills/foo/SKILL.md": "name: foo\n"}), dest)
    assert r.returncode == 0, r.stderr
    assert (dest / "skills" / "foo" / "SKILL.md").read_text() == "name: foo\n"


@pytest.mark.parametrize("shell", SHELLS)
def test_a_directory_where_a_file_goes_is_refused_before_anything_is_written(tmp_path, shell):
    """A directory where the release writes a file, or someone's file where it needs a directory:
    refused before anything is written, and the release records stay the old ones, so the next
    install or update runs again (the install was recorded, then failed its check)."""
    dest = tmp_path / "dest"
    assert _run(shell, _script(tmp_path, "rel_1", {"skills/foo/SKILL.md": "name: foo\n", "rules.md": "- a\n"}),
                dest).returncode == 0
    before = _snapshot(dest)
    r = _run(shell, _script(tmp_path, "rel_2", {"skills/foo": "now a file\n", "rules.md": "- b\n"}), dest)
    assert r.returncode == 1 and "is a directory where this release installs a file" in r.stderr
    assert _snapshot(dest) == before
    (dest / "notes").write_text("mine\n")
    r = _run(shell, _script(tmp_path, "rel_3", {"notes/today.md": "x\n", "rules.md": "- c\n"}), dest)
    assert r.returncode == 1 and "is a file where this release needs a directory" in r.stderr
    assert _snapshot(dest) == {**before, "notes": "mine\n"}


@pytest.mark.parametrize("shell", SHELLS)
def test_long_names_install_and_a_users_tmp_named_file_is_left_alone(tmp_path, shell):
    """The temporary name is short and private (a 250-character name plus a suffix did not fit
    a file name; a user's ``rules.md.reef-tmp`` was deleted)."""
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "rules.md.reef-tmp").write_text("precious\n")
    long_name = "s" * 250
    r = _run(shell, _script(tmp_path, "rel_1", {"rules.md": "- a\n", f"skills/{long_name}": "x\n"}), dest)
    assert r.returncode == 0, r.stderr
    assert (dest / "skills" / long_name).read_text() == "x\n"
    assert (dest / "rules.md.reef-tmp").read_text() == "precious\n"
    assert not list(dest.rglob(".reef-tmp.*"))


@pytest.mark.parametrize("shell", SHELLS)
def test_settings_that_name_the_release_are_written_last(tmp_path, shell):
    """A file carrying x-reef-installed-release tells the server the agent has the harness: it is
    written after every other file (it sorted first here), so a failure part-way never leaves it
    claiming the release."""
    dest = tmp_path / "dest"
    files = {"a-settings.json": '{"headers": {"x-reef-installed-release": "rel_1"}}\n', "z-rules.md": "- rule\n"}
    script = _script(tmp_path, "rel_1", files)
    traced = subprocess.run([shell, "-x", str(script), str(dest)], capture_output=True, text=True, timeout=60)
    assert traced.returncode == 0, traced.stderr
    moved = [ln for ln in traced.stderr.splitlines() if "mv -f" in ln and ".reef-tmp." in ln]
    assert len(moved) == 2 and moved[-1].endswith(str(dest / "a-settings.json")), moved


@pytest.mark.parametrize("shell", SHELLS)
def test_a_file_written_byte_by_byte_may_start_with_a_dash(tmp_path, shell):
    """A file the installer writes with printf (a NUL, a CR, no final newline) whose chunk starts
    with "-" (every rules.md: "- a rule"): printf read it as an option and the install failed."""
    dest = tmp_path / "dest"
    files = {"rules.md": "- Hello\x00world.\n- " + "x" * 70, "notes.md": "-\r\n"}
    r = _run(shell, _script(tmp_path, "rel_1", files), dest)
    assert r.returncode == 0, r.stderr
    assert (dest / "rules.md").read_bytes() == files["rules.md"].encode()
    assert (dest / "notes.md").read_bytes() == b"-\r\n"


@pytest.mark.parametrize("shell", SHELLS)
def test_one_install_into_dest_at_a_time(tmp_path, shell):
    """Two installs at once into one DEST mixed two releases' files: a second one is refused while
    the first runs; the lock of an install that was killed is taken over."""
    import subprocess as sp

    dest = tmp_path / "dest"
    lock = dest / ".reef-install.lock"
    lock.mkdir(parents=True)
    (lock / "pid").write_text(f"{os.getpid()}\n")  # a live process holds it
    busy = _run(shell, _script(tmp_path, "rel_1", V1), dest)
    assert busy.returncode == 1 and f"another install into {dest} is running (process {os.getpid()})" in busy.stderr
    assert not (dest / "rules.md").exists()
    gone = sp.Popen(["true"])
    gone.wait()
    (lock / "pid").write_text(f"{gone.pid}\n")  # killed: its process is gone
    taken = _run(shell, _script(tmp_path, "rel_1", V1), dest)
    assert taken.returncode == 0, taken.stderr
    assert (dest / "rules.md").read_text() == V1["rules.md"] and not lock.exists()
    lock.mkdir()  # no process named yet
    starting = _run(shell, _script(tmp_path, "rel_2", V2), dest)
    assert starting.returncode == 1 and f"remove {lock}" in starting.stderr
