"""Which state directory the last server started in a directory serves: the per-user record
that lets ``reef releases`` run with no arguments in the directory where ``reef serve
server.state_dir=elsewhere`` was started find that server (or, once it stopped, its state).

One small JSON file per working directory (named by a hash of its path) under
``$REEF_SERVERS_DIR``, else ``$XDG_STATE_HOME/reef/servers``, else
``~/.local/state/reef/servers``: ``{cwd, state_dir, pid, started_at}``, overwritten by each
server started there and kept when it stops, as ``served-config.json`` is. It names the
state directory only; what runs there, and with which configuration, is that directory's
``served-config.json`` (``reef_core.served_config``). Failures to write are logged, never
raised: serving goes on, and the CLI then looks in the configured state directory only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

log = logging.getLogger("reef")

ENV = "REEF_SERVERS_DIR"


def registry_dir() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "reef" / "servers"


def _entry(cwd: Path) -> Path:
    return registry_dir() / f"{hashlib.sha256(str(cwd).encode()).hexdigest()[:24]}.json"


def remember(state_dir: Path, *, started_at: str, cwd: Path | None = None) -> None:
    """Record that a server started in ``cwd`` (default: this process's) serves ``state_dir``."""
    cwd = (cwd or Path.cwd()).resolve()
    path = _entry(cwd)
    data = {"cwd": str(cwd), "state_dir": str(Path(state_dir).resolve()), "pid": os.getpid(),
            "started_at": started_at}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not record %s in %s (the CLI run in %s finds this server only by its "
                    "state directory): %s", state_dir, path, cwd, exc)


def state_dir_served_from(cwd: Path | None = None) -> Path | None:
    """The state directory the last server started in ``cwd`` served, or None."""
    cwd = (cwd or Path.cwd()).resolve()
    try:
        data = json.loads(_entry(cwd).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("cwd") != str(cwd) or not data.get("state_dir"):
        return None
    return Path(data["state_dir"])
