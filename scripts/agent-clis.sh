#!/usr/bin/env bash
# Install the coding-agent CLIs the agent tests drive (tests/agents/), pinned, into a cache
# outside the repository: ${REEF_AGENT_CLI_DIR:-~/.cache/reef-agents/npm}. Idempotent: a
# second run with the same pins does nothing. Without npm it says so and exits 0 (the agent
# tests then skip, naming the reason). REEF_SKIP_AGENT_CLIS=1 skips the step.
#   Usage: scripts/agent-clis.sh [--print-dir]
set -euo pipefail
DIR=${REEF_AGENT_CLI_DIR:-$HOME/.cache/reef-agents/npm}
PINS=("@anthropic-ai/claude-code@2.1.332" "@openai/codex@0.169.0")
if [ "${1:-}" = --print-dir ]; then echo "$DIR"; exit 0; fi
if [ "${REEF_SKIP_AGENT_CLIS:-0}" = 1 ]; then
  echo "agent-clis: skipped (REEF_SKIP_AGENT_CLIS=1); the Claude Code and Codex tests install them when they run" >&2
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "agent-clis: npm is not installed; the Claude Code and Codex tests will skip" >&2
  exit 0
fi
stamp="$DIR/.reef-pins"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${PINS[*]}" ] && [ -x "$DIR/node_modules/.bin/claude" ] \
    && [ -x "$DIR/node_modules/.bin/codex" ]; then
  exit 0
fi
mkdir -p "$DIR"
echo "agent-clis: installing ${PINS[*]} into $DIR"
npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error "${PINS[@]}" >/dev/null
printf '%s' "${PINS[*]}" > "$stamp"
