#!/usr/bin/env bash
# apt-get that waits, bounded, for another package manager to let go of its lock instead of
# failing at once: a fresh machine often runs unattended-upgrades or cloud-init's apt at boot.
# Usage: scripts/apt-get.sh ARGS...   (as apt-get; sudo is added when not root)
#   REEF_APT_LOCK_WAIT  seconds to wait for the lock in all (default 300)
#   REEF_APT_LOCK_POLL  seconds between tries while it is held (default 5)
# dpkg's lock is waited for by apt itself (DPkg::Lock::Timeout); `apt-get update` takes the
# package lists' lock, which that option does not cover on every apt, so a lock error is also
# retried here until the same deadline. apt's own messages (which process holds the lock) show.
set -euo pipefail
WAIT=${REEF_APT_LOCK_WAIT:-300}
POLL=${REEF_APT_LOCK_POLL:-5}
SUDO=(); [ "$(id -u)" = 0 ] || SUDO=(sudo)
deadline=$((SECONDS + WAIT))
err=$(mktemp)
trap 'rm -f "$err"' EXIT
exec 3>&1
said=0
while true; do
  left=$((deadline - SECONDS)); [ "$left" -gt 0 ] || left=0
  # stderr shows as it comes and is kept in $err; stdout goes where this script's goes
  set +e
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$left" "$@" \
    2>&1 1>&3 3>&- | tee "$err" >&2
  status=${PIPESTATUS[0]}
  set -e
  [ "$status" != 0 ] || exit 0
  grep -qiE "could not get lock|unable to acquire|unable to lock" "$err" || exit "$status"
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "apt-get.sh: another process still holds the package manager's lock after ${WAIT}s" \
         "(REEF_APT_LOCK_WAIT); let it finish and run this again" >&2
    exit "$status"
  fi
  if [ "$said" = 0 ]; then
    echo "apt-get.sh: another process holds the package manager's lock; waiting for it (at most ${WAIT}s," \
         "REEF_APT_LOCK_WAIT)" >&2
    said=1
  fi
  left=$((deadline - SECONDS))
  sleep $((left < POLL ? (left > 0 ? left : 1) : POLL))
done
