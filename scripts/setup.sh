#!/usr/bin/env bash
# Set up everything Reef needs on a fresh Debian machine; idempotent (a second run is fast).
#   - Debian packages: git-lfs, and PostgreSQL when --with-postgres is given
#   - a virtualenv in .venv with reef-core and every package scripts/packages.sh --installed lists
#     (plugins/*, reef_recipe_*) installed editable; examples/* are deliberately not (see there)
#   - the coding-agent CLIs (Claude Code, Codex) from npm, pinned, into ~/.cache/reef-agents
#     (scripts/agent-clis.sh; skipped with a note when npm is absent)
# Usage: scripts/setup.sh [--with-postgres] [--with-browser]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${REEF_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}

want_pg=0; want_browser=0
for arg in "$@"; do
  case "$arg" in
    --with-postgres) want_pg=1 ;;
    --with-browser) want_browser=1 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

# ---------------------------------------------------------------- Debian packages
need=()
command -v git >/dev/null || need+=(git)
command -v git-lfs >/dev/null || need+=(git-lfs)
if [ "$want_pg" = 1 ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  need+=(postgresql)
fi
if [ "$want_browser" = 1 ] && ! command -v chromium >/dev/null; then
  need+=(chromium)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need[*]}"
  # waits (bounded, REEF_APT_LOCK_WAIT) while another process holds the package manager's lock
  scripts/apt-get.sh update -qq
  scripts/apt-get.sh install -y -qq "${need[@]}" >/dev/null
fi

# ---------------------------------------------------------------- Python environment
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
# install ARGS: `pip install ARGS` into the venv, by uv when the venv has it (scripts/setup.sh puts
# it there) and pip's configuration says nothing uv would not be told (scripts/uv-install.py, which
# hands uv pip's indexes, find-links and constraints): the same packages in a third of pip's time
# (Reef, its plugins and torch into a new venv: 9.5 s against 28 s on 2 cores). pip otherwise.
install() {
  if [ -x "$VENV/bin/uv" ] && "$VENV/bin/python" scripts/uv-install.py --check; then
    "$VENV/bin/python" scripts/uv-install.py -q "$@"
  else
    # -qq: errors only. With -q every editable build prints setuptools' ~10-line informational
    # BuildBackendWarning ("Editable installation ...": about 50 lines for the repository's
    # packages); resolver conflicts and failures are errors and still print.
    "$VENV/bin/pip" install -qq --no-compile "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }
  fi
}

# Reinstall only when a project file changed: the stamp is a hash of the root pyproject.toml,
# every installed package's (a new package adds one) and these scripts.
packages=()
while IFS= read -r p; do packages+=("$p"); done < <(scripts/packages.sh --installed)
stamp="$VENV/.reef-setup-stamp"
hash=$( (printf '%s\n' "${packages[@]}"
         cat pyproject.toml "${packages[@]/%//pyproject.toml}" scripts/setup.sh scripts/packages.sh scripts/uv-install.py) | sha256sum | cut -d' ' -f1)
# The embedded model's GGUF (git-ignored, put into plugins/reef_smollm2 by its editable install)
# is part of the install too: a checkout cleaned of ignored files reinstalls.
model_ok() { "$VENV/bin/python" -c "import reef_smollm2; reef_smollm2.gguf_path()" >/dev/null 2>&1; }
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$hash" ] || ! model_ok; then
  echo "setup: installing Python packages (torch pinned to the CPU build 2.13.0)"
  # (wheel: uv builds the sdists among the dependencies without isolation too, and one needs it)
  "$VENV/bin/pip" install -q --upgrade pip "setuptools>=68" wheel >/dev/null 2>&1 || true
  # Every package builds with setuptools.build_meta and asks for setuptools>=68 only: when that
  # holds, its editable build runs in this venv (--no-build-isolation) instead of a throwaway
  # environment that pip first installs setuptools into, ~1.5 s for each of the 11 builds.
  isolation=()
  if "$VENV/bin/python" scripts/builds-here.py . "${packages[@]}"; then isolation=(--no-build-isolation); fi
  # torch is pinned in the same command as every package that depends on it, so pip never
  # pulls a multi-GB CUDA build.
  pkgs=(torch==2.13.0 -e ".[test,postgres,demo]")
  for p in "${packages[@]}"; do
    case "$p" in
      # Ray for reef-train's `ray` trainer backend and its tests (~35 s, ~240 MB of wheels)
      */reef_train) pkgs+=(-e "./$p[ray]") ;;
      *) pkgs+=(-e "./$p") ;;
    esac
  done
  # uv for install() when it can be had. Neither compiles bytecode: Python compiles a module
  # when it first imports it and keeps the bytecode. Compiling all 27,000 modules here (torch's,
  # transformers', ...) took 25 s on 2 cores, and the test suite imports about 40% of them: the
  # whole scripts/test on a fresh clone 5.9 minutes without, 6.1 with (its tests 11 s slower).
  "$VENV/bin/pip" install -qq "uv>=0.9,<1" >/dev/null 2>&1 || true
  install ${isolation[@]+"${isolation[@]}"} "${pkgs[@]}"
  "$VENV/bin/python" -c "import reef_core" >/dev/null
  # The embedded model came with them (reef-torch depends on reef-smollm2, whose build step
  # fetches the GGUF, checks its sha256 and puts it into the package): no separate step.
  model_ok || { echo "setup: reef-smollm2 was installed without its GGUF" >&2; exit 1; }
  echo "$hash" > "$stamp"
fi

# Playwright's Python API drives Debian's chromium in tests/ui/ (never `playwright install`:
# the browser comes from Debian, the tests pass its path as executable_path).
if [ "$want_browser" = 1 ] && ! "$VENV/bin/python" -c "import playwright" >/dev/null 2>&1; then
  echo "setup: installing Playwright (Python API)"
  isolation=()
  if "$VENV/bin/python" scripts/builds-here.py .; then isolation=(--no-build-isolation); fi
  install ${isolation[@]+"${isolation[@]}"} -e ".[browser]"
fi

# ---------------------------------------------------------------- coding-agent CLIs
# Claude Code and Codex, pinned, into a cache outside the repository (tests/agents/ drive them).
scripts/agent-clis.sh
