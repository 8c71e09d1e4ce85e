#!/usr/bin/env bash
# Start (or reuse) a throwaway PostgreSQL server for the test suite and print its URL.
# It runs as the `postgres` user when invoked as root (the server refuses to run as root).
set -euo pipefail
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$PGBIN" ] || { echo "postgres.sh: PostgreSQL is not installed (run scripts/setup.sh --with-postgres)" >&2; exit 1; }
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
