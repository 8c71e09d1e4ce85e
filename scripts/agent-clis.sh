#!/usr/bin/env bash
# Install the coding-agent CLIs the agent tests drive (tests/loop/test_agents_*.py), pinned, into a cache
# outside the repository: ${REEF_AGENT_CLI_DIR:-~/.cache/reef-agents/npm}. Idempotent: a
# second run with the same pins does nothing. Without npm it says so and exits 0 (the agent
# tests then skip, naming the reason). REEF_SKIP_AGENT_CLIS=1 skips the step.
#   Usage: scripts/agent-clis.sh [--print-dir]
set -euo pipefail
DIR=${REEF_AGENT_CLI_DIR:-$HOME/.cache/reef-agents/npm}
# opencode-ai ships its binary in a platform package (opencode-linux-x64, ...), an optional
# dependency that its postinstall links to node_modules/.bin/opencode: so neither
# --omit=optional nor --ignore-scripts may be in effect
PINS=("@anthropic-ai/claude-code@2.1.332" "@openai/codex@0.169.0" "opencode-ai@1.18.33")
BINS=(claude codex opencode)
if [ "${1:-}" = --print-dir ]; then echo "$DIR"; exit 0; fi
if [ "${REEF_SKIP_AGENT_CLIS:-0}" = 1 ]; then
  echo "agent-clis: skipped (REEF_SKIP_AGENT_CLIS=1); the agent tests install them when they run" >&2
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "agent-clis: npm is not installed; the Claude Code, Codex and opencode tests will skip" >&2
  exit 0
fi
stamp="$DIR/.reef-pins"
installed() {
  local bin
  for bin in "${BINS[@]}"; do [ -x "$DIR/node_modules/.bin/$bin" ] || return 1; done
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${PINS[*]}" ] && installed; then
  exit 0
fi
mkdir -p "$DIR"
echo "agent-clis: installing ${PINS[*]} into $DIR"
npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error --include=optional --ignore-scripts=false \
  "${PINS[@]}" >/dev/null
# the platform binary must be there and run (printing its version needs no network)
if ! version=$("$DIR/node_modules/.bin/opencode" --version 2>&1); then
  echo "agent-clis: opencode does not run on this machine: $version" >&2
fi
printf '%s' "${PINS[*]}" > "$stamp"
