#!/usr/bin/env bash
# A throwaway PostgreSQL server for the test suite.
#   scripts/postgres.sh              start (or reuse) the one on REEF_TEST_PG_PORT (55432) with its data in
#                                    REEF_TEST_PG_DIR (/tmp/reef-test-pg) and print its URL; it keeps running
#   scripts/postgres.sh --run CMD..  start a new one on a free port in a new directory, run CMD with
#                                    REEF_TEST_POSTGRES_URL set to it, then stop and remove it (also when
#                                    CMD fails or is interrupted); exits with CMD's status
#   scripts/postgres.sh --stop       stop the one in REEF_TEST_PG_DIR
# It runs as the `postgres` user when invoked as root (the server refuses to run as root).
set -euo pipefail
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$PGBIN" ] || { echo "postgres.sh: PostgreSQL is not installed (run scripts/setup.sh --with-postgres)" >&2; exit 1; }
if [ "${1:-}" = "--run" ]; then
  shift
  [ $# -gt 0 ] || { echo "postgres.sh: --run needs a command" >&2; exit 2; }
  REEF_TEST_PG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/reef-test-pg.XXXXXX")
  REEF_TEST_PG_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  export REEF_TEST_PG_DIR REEF_TEST_PG_PORT
  self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
  trap '"$self" --stop >/dev/null 2>&1 || true; rm -rf "$REEF_TEST_PG_DIR"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  REEF_TEST_POSTGRES_URL=$("$self")
  export REEF_TEST_POSTGRES_URL
  status=0
  "$@" || status=$?
  exit "$status"
fi
PORT=${REEF_TEST_PG_PORT:-55432}
BASE=${REEF_TEST_PG_DIR:-/tmp/reef-test-pg}
DATA=$BASE/data
RUN=()
if [ "$(id -u)" = 0 ]; then
  RUN=(runuser -u postgres --)
  mkdir -p "$BASE"; chown postgres "$BASE"
else
  mkdir -p "$BASE"
fi
if [ "${1:-}" = "--stop" ]; then
  "${RUN[@]}" "$PGBIN/pg_ctl" -D "$DATA" -w -t 60 -m fast stop >/dev/null
  exit 0
fi
if [ ! -f "$DATA/PG_VERSION" ]; then
  "${RUN[@]}" "$PGBIN/initdb" -D "$DATA" -U reef --auth=trust -E UTF8 >/dev/null
fi
if ! "${RUN[@]}" "$PGBIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  "${RUN[@]}" "$PGBIN/pg_ctl" -D "$DATA" -l "$BASE/server.log" -w -t 60 \
    -o "-p $PORT -k $BASE -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
fi
if ! "${RUN[@]}" "$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U reef -d postgres -tAc \
     "SELECT 1 FROM pg_database WHERE datname='reef_test'" | grep -q 1; then
  "${RUN[@]}" "$PGBIN/createdb" -h 127.0.0.1 -p "$PORT" -U reef reef_test
fi
echo "postgresql+psycopg://reef@127.0.0.1:$PORT/reef_test"
