"""The ``files`` harness adapter: a self-contained POSIX sh installer of a release's harness tree.

``GET /reef/harness/install?adapter=files`` returns the script; ``sh install.sh [DEST]``
writes the tree into DEST (default ``$REEF_HARNESS_DIR``, else ``./reef-harness``). The
script carries every file inline (no callback to the server, no token), and:

0. checks every path that either manifest names — its own payload, and the
   manifest a previous install left in DEST (``.reef-harness.sha256``; each agent adapter
   keeps its own, ``.reef-harness-<adapter>.sha256``) — before touching anything: a
   path must be relative, made of parts like Reef's artifact names (no ``..``, ``.``,
   empty or dot-leading parts, no odd characters), and reach no symbolic link inside DEST.
   Any bad path refuses the whole install, with nothing changed: the old manifest is a
   local file anyone with write access to DEST could edit, and its paths are what the prune
   step removes, so skipping bad lines would leave a tampered file silently in charge; and,
   once its own payload checks, takes DEST's lock (``.reef-install.lock``, naming its process):
   a second install into DEST while one runs is refused, a killed one's lock is taken over;
1. writes the files into a private staging directory and checks each one against the
   SHA-256 it was generated with — a damaged or tampered script fails here, before DEST
   is touched;
2. exits without writing when DEST already holds exactly this release ("already current");
3. refuses to overwrite a file changed since the last install (or present but not
   installed by it) unless ``REEF_HARNESS_FORCE=1`` — a file that already holds what this
   release installs is not a change;
4. refuses, before writing anything, a directory where the release writes a file or a
   file where it needs a directory (unless the previous release installed that file and
   this one drops it);
5. removes files the previous release had and this one does not, installs each file
   atomically (a short temporary name beside it, then a rename), the files that name the
   release to the server (an agent's settings) last, verifies DEST against the checksums,
   and only then records the manifest (``sha256sum -c`` format) and
   ``.reef-harness-release`` (``.reef-harness-<adapter>-release``): an install that fails
   part-way is never recorded as complete.

Checksums use ``sha256sum``, ``shasum -a 256`` or ``openssl``, whichever exists.
"""

from __future__ import annotations

import hashlib
import posixpath
from typing import Any

from ..commit.artifacts import ArtifactError, check_path
from ..commit.harness import HarnessBundle
from ..contracts import HarnessAdapter
from ..hookspecs import hookimpl

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 .,_-/:=+@")

#: the characters of Reef's artifact file names (``reef_core.commit.artifacts.check_path``)
_NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._+@-"

_PRELUDE = r"""set -eu
umask 022
DEST=${1:-${REEF_HARNESS_DIR:-@DEFAULT_DEST@}}
fail() { printf 'reef-harness: %s\n' "$*" >&2; exit 1; }
if command -v sha256sum >/dev/null 2>&1; then
  sha() { sha256sum "$1" | cut -d ' ' -f 1; }
elif command -v shasum >/dev/null 2>&1; then
  sha() { shasum -a 256 "$1" | cut -d ' ' -f 1; }
elif command -v openssl >/dev/null 2>&1; then
  sha() { openssl dgst -sha256 "$1" | sed 's/^.*= *//'; }
else
  fail "sha256sum, shasum or openssl is needed to verify the files"
fi
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/@MKTEMP_TEMPLATE@") || fail "cannot create a staging directory"
trap 'rm -rf "$STAGE"' EXIT
trap 'exit 130' INT TERM
"""

_INSTALL = r"""
# 0. every path a manifest names stays inside DEST: relative, plain parts, no symbolic link.
#    Checked for this installer's payload and for the manifest a previous install left in
#    DEST (a local file: its paths are what the prune step removes) before anything is written.
safe_path() {
  case $1 in ''|/*|*/) return 1 ;; esac
  _rest=$1
  # an agent's own configuration directory (e.g. .claude/) may lead a path: only these
  case $_rest in @CONFIG_DIRS@) _rest=${_rest#*/} ;; esac
  while :; do
    _part=${_rest%%/*}
    case $_part in ''|.*|*[!@NAME_CHARS@]*) return 1 ;; esac
    [ "$_rest" != "$_part" ] || return 0
    _rest=${_rest#*/}
  done
}
shown() { printf '%s' "$1" | sed 's/[^/@NAME_CHARS@]/?/g'; }
no_links() {
  _rest=$1
  _at=$DEST
  while :; do
    _part=${_rest%%/*}
    _at=$_at/$_part
    if [ -L "$_at" ]; then
      fail "$(shown "$_at") is a symbolic link; the installer writes and removes only inside $DEST, \
so it refuses to go through it (nothing was changed); replace it with a plain directory or file and re-run"
    fi
    [ "$_rest" != "$_part" ] || return 0
    _rest=${_rest#*/}
  done
}
check_manifest() {
  while read -r sum path; do
    [ -n "$path" ] || continue
    safe_path "$path" || fail "$2 lists the unsafe path '$(shown "$path")' (absolute, '..', '.', empty or \
odd parts); refusing to install (nothing was changed); $3"
    no_links "$path"
  done <<REEF_SUMS
$1
REEF_SUMS
}
check_manifest "$SUMS" "this installer" "it is damaged or was tampered with; download it again"

# 1. the payload must be exactly what the server generated
while read -r sum path; do
  [ -n "$path" ] || continue
  [ -f "$STAGE/$path" ] && [ "$(sha "$STAGE/$path")" = "$sum" ] \
    || fail "checksum mismatch for $path in this installer: it is damaged or was tampered with; download it again"
done <<REEF_SUMS
$SUMS
REEF_SUMS

# one install into DEST at a time: two at once (two releases, two agents) mixed their files. A
# lock whose process is gone (killed) is taken over; one that names no process yet is refused.
mkdir -p "$DEST" || fail "cannot create $DEST"
LOCK=$DEST/.reef-install.lock
if ! mkdir "$LOCK" 2>/dev/null; then
  _pid=$(cat "$LOCK/pid" 2>/dev/null || true)
  case $_pid in ''|*[!0-9]*) fail "another install into $DEST is starting (or one was killed as it started: \
if none runs, remove $LOCK); re-run" ;; esac
  kill -0 "$_pid" 2>/dev/null && fail "another install into $DEST is running (process $_pid); re-run when it ends"
  rm -rf "$LOCK"
  mkdir "$LOCK" 2>/dev/null || fail "another install into $DEST started just now; re-run when it ends"
fi
trap 'rm -rf "$STAGE" "$LOCK"' EXIT
printf '%s\n' "$$" > "$LOCK/pid"

OLD=
[ -f "$DEST/@MANIFEST@" ] && OLD=$(cat "$DEST/@MANIFEST@")
check_manifest "$OLD" "$DEST/@MANIFEST@" "repair or delete that file and re-run"

# 2. nothing to do when DEST holds exactly this release
current=yes
[ -f "$DEST/@MANIFEST@" ] && [ "$(cat "$DEST/@MANIFEST@")" = "$SUMS" ] || current=no
if [ "$current" = yes ]; then
  while read -r sum path; do
    [ -n "$path" ] || continue
    { [ -f "$DEST/$path" ] && [ "$(sha "$DEST/$path")" = "$sum" ]; } || { current=no; break; }
  done <<REEF_SUMS
$SUMS
REEF_SUMS
fi
if [ "$current" = yes ]; then
  printf 'reef-harness: %s is already current (release %s)\n' "$DEST" "$RELEASE"
  exit 0
fi

# 3. never overwrite local changes silently. A file that already holds what this release
#    installs is no local change: another adapter sharing DEST (AGENTS.md, for Codex and
#    opencode) may have written it since.
new_sum() {
  while read -r _sum _path; do
    [ "$_path" = "$1" ] && { printf '%s' "$_sum"; return 0; }
  done <<REEF_SUMS
$SUMS
REEF_SUMS
  return 0
}
if [ "${REEF_HARNESS_FORCE:-0}" != 1 ]; then
  while read -r sum path; do
    [ -n "$path" ] && [ -f "$DEST/$path" ] || continue
    _now=$(sha "$DEST/$path")
    [ "$_now" = "$sum" ] || [ "$_now" = "$(new_sum "$path")" ] \
      || fail "$DEST/$path was changed since it was installed; keep a copy and re-run with REEF_HARNESS_FORCE=1 to replace it"
  done <<REEF_SUMS
$OLD
REEF_SUMS
  while read -r sum path; do
    [ -n "$path" ] && [ -f "$DEST/$path" ] || continue
    case "
$OLD
" in *"  $path
"*) continue ;; esac
    _now=$(sha "$DEST/$path")
    [ "$_now" = "$sum" ] && continue
    # installed, as it is now, by another agent's installer sharing the file (AGENTS.md for Codex
    # and opencode) at another release: Reef's, not the user's
    for _other in "$DEST"/.reef-harness*.sha256; do
      [ -f "$_other" ] && [ "$_other" != "$DEST/@MANIFEST@" ] || continue
      grep -qxF "$_now  $path" "$_other" && continue 2
    done
    fail "$DEST/$path exists and was not installed by Reef; move it away or re-run with REEF_HARNESS_FORCE=1"
  done <<REEF_SUMS
$SUMS
REEF_SUMS
fi

# 4. the shape of DEST: a directory where this release writes a file, or a file where it needs a
#    directory, is refused before anything is written, unless that file is one the previous
#    release installed and this one drops (removed now, so its directory can be made)
while read -r sum path; do
  [ -n "$path" ] || continue
  [ -d "$DEST/$path" ] && fail "$DEST/$path is a directory where this release installs a file; move it away \
and re-run (nothing was changed)"
  _rest=${path%/*}
  [ "$_rest" != "$path" ] || continue
  _at=$DEST
  while :; do
    _part=${_rest%%/*}
    _at=$_at/$_part
    if [ -e "$_at" ] && [ ! -d "$_at" ]; then
      case "
$OLD
" in *"  ${_at#"$DEST"/}
"*) case "
$SUMS
" in *"  ${_at#"$DEST"/}
"*) ;; *) continue 2 ;; esac ;; esac
      fail "$_at is a file where this release needs a directory; move it away and re-run (nothing was changed)"
    fi
    [ "$_rest" != "$_part" ] || break
    _rest=${_rest#*/}
  done
done <<REEF_SUMS
$SUMS
REEF_SUMS

# 5. prune, install, verify, record. Files the previous release had and this one drops go first
#    (one may be where this release needs a directory). Files that name the release to the
#    server (an agent's settings carrying x-reef-installed-release) are written last: until
#    they are, the server goes on adding the harness to requests. The records (manifest,
#    release) are written only once every file checks: an install that fails part-way is not
#    taken for a complete one, and the next install or update runs again.
while read -r sum path; do
  [ -n "$path" ] || continue
  case "
$SUMS
" in *"  $path
"*) continue ;; esac
  rm -f "$DEST/$path"
done <<REEF_SUMS
$OLD
REEF_SUMS
mkdir -p "$DEST" || fail "cannot create $DEST"
put() {
  _dir=$(dirname "$DEST/$1")
  mkdir -p "$_dir" || fail "cannot create $_dir"
  # a short name of its own beside the target (a long file name plus a suffix may not fit);
  # rm first: cp would follow a symbolic link planted at that name
  _tmp=$_dir/.reef-tmp.$$
  rm -f "$_tmp" && cp "$STAGE/$1" "$_tmp" && mv -f "$_tmp" "$DEST/$1" \
    || { rm -f "$_tmp"; fail "cannot write $DEST/$1 (the install is incomplete: re-run it)"; }
}
for _pass in files settings; do
  while read -r sum path; do
    [ -n "$path" ] || continue
    if grep -q 'x-reef-installed-release' "$STAGE/$path" 2>/dev/null; then
      [ "$_pass" = settings ] || continue
    else
      [ "$_pass" = files ] || continue
    fi
    put "$path"
  done <<REEF_SUMS
$SUMS
REEF_SUMS
done
while read -r sum path; do
  [ -n "$path" ] || continue
  [ "$(sha "$DEST/$path")" = "$sum" ] || fail "verification failed for $DEST/$path after installing (the install \
is incomplete: re-run it)"
done <<REEF_SUMS
$SUMS
REEF_SUMS
# written beside and renamed into place, so a symbolic link at either name is replaced, not followed
rm -f "$DEST/@MANIFEST@.reef-tmp" "$DEST/@SIDECAR@.reef-tmp"
printf '%s\n' "$SUMS" > "$DEST/@MANIFEST@.reef-tmp" &&
  mv -f "$DEST/@MANIFEST@.reef-tmp" "$DEST/@MANIFEST@" || fail "cannot write $DEST/@MANIFEST@"
printf 'release_id=%s\ncontent_hash=%s\nscenario=%s\n' "$RELEASE" "$CONTENT" "$SCENARIO" \
  > "$DEST/@SIDECAR@.reef-tmp" && mv -f "$DEST/@SIDECAR@.reef-tmp" "$DEST/@SIDECAR@" || fail "cannot write $DEST/@SIDECAR@"
printf 'reef-harness: installed release %s into %s\n' "$RELEASE" "$DEST"
"""


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def _write_file(path: str, data: bytes) -> list[str]:
    target = f'"$STAGE"/{_quote(path)}'
    delimiter = "REEF_EOF_" + hashlib.sha256(data).hexdigest()[:16]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.endswith("\n") and "\0" not in text and "\r" not in text \
            and delimiter not in text.splitlines():
        return [f"cat > {target} <<'{delimiter}'", text + delimiter]
    lines = [f": > {target}"]
    for i in range(0, len(data), 64):
        chunk = "".join(chr(b) if b in _SAFE else f"\\{b:03o}" for b in data[i:i + 64])
        if chunk.startswith("-"):  # printf would read a leading "-" as an option ("- a rule")
            chunk = "\\055" + chunk[1:]
        lines.append(f"printf '{chunk}' >> {target}")
    return lines


#: the last line of every installer
INSTALLER_END = "# end of the Reef harness installer"


class FilesAdapter(HarnessAdapter):
    """Renders a release's harness tree as a checksum-verified POSIX sh installer."""

    media_type = "text/x-shellscript"
    #: the name it registers under (shown in the installer's header)
    adapter_name = "files"
    #: where ``sh install.sh`` writes without a DEST argument or ``$REEF_HARNESS_DIR``
    default_dest = "./reef-harness"
    #: dot-directories a path may start with (an agent's configuration, e.g. ``.claude``);
    #: every other part of every path is held to Reef's artifact names
    config_dirs: tuple[str, ...] = ()
    #: shown by ``reef harness adapters``
    description = "the release's harness tree as it is (system.md, rules.md, skills/<name>/SKILL.md)"
    #: the installer's records in DEST: what it installed (``sha256sum -c`` format) and from
    #: which release; an adapter that shares DEST with others keeps its own (``harness_agents``)
    manifest = ".reef-harness.sha256"
    sidecar = ".reef-harness-release"

    def render(self, bundle: HarnessBundle) -> str:
        for f in bundle.files:  # Reef made these paths; an installer must never carry a bad one
            head, _, rest = f.path.partition("/")
            try:
                check_path(rest if head in self.config_dirs and rest else f.path)
            except ArtifactError:
                raise ArtifactError(f"the harness of release {bundle.release_id} has the unsafe file path "
                                    f"{f.path!r}; refusing to render an installer for it") from None
        sums = "\n".join(f"{f.sha256}  {f.path}" for f in bundle.files)
        out = [
            "#!/bin/sh",
            f"# Reef harness installer (adapter: {self.adapter_name}) for scenario {bundle.scenario!r}",
            f"# release {bundle.release_id}, content {bundle.content_hash}, {len(bundle.files)} file(s)",
            f"# usage: sh install.sh [DEST]   (DEST defaults to $REEF_HARNESS_DIR, else {self.default_dest})",
            # mktemp's template ends in six X (spelled out here so no literal reads like a marker)
            _PRELUDE.replace("@MKTEMP_TEMPLATE@", "reef-harness." + "X" * 6)
                    .replace("@DEFAULT_DEST@", self.default_dest),
            f"RELEASE={_quote(bundle.release_id)}",
            f"CONTENT={_quote(bundle.content_hash)}",
            f"SCENARIO={_quote(bundle.scenario)}",
            f"SUMS={_quote(sums)}",
            "",
        ]
        dirs = sorted({posixpath.dirname(f.path) for f in bundle.files} - {""})
        out += [f'mkdir -p "$STAGE"/{_quote(d)}' for d in dirs]
        for f in bundle.files:
            out += _write_file(f.path, f.data)
        # a case pattern that no path reaching it can match ("/": absolute paths are refused first)
        config_dirs = "|".join(f"{d}/*" for d in self.config_dirs) or "/"
        out.append(_INSTALL.replace("@NAME_CHARS@", _NAME_CHARS).replace("@CONFIG_DIRS@", config_dirs)
                   .replace("@MANIFEST@", self.manifest).replace("@SIDECAR@", self.sidecar))
        out.append(INSTALLER_END)  # a body cut short lacks it: `reef agent install` runs only a whole one
        return "\n".join(out) + "\n"


@hookimpl
def register_harness_adapters(register: Any) -> None:
    register("files", FilesAdapter)
