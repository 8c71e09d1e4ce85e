"""What a state directory was last served with: ``<state_dir>/served-config.json``.

A server writes it when it starts (the app's lifespan, so ``reef serve`` and the test server
both do) and marks it ``running: false`` when it stops; the file stays, because the CLI
compares against it. It holds the resolved settings with every secret masked, where the
server listens, its pid, when it started and stopped, and the learning-relevant part of the
settings (``LEARNING_KEYS``) with its hash.

It also holds how ``reef serve`` composed its configuration (``composed_from``: the working
directory, the config file's absolute path and the overrides, those that carry a secret left
out), so a command run with no arguments composes the server's configuration again and uses
it (``ServedConfig.recompose``) instead of the defaults, and ``reef_core.served_dirs`` records
which state directory a server started in a directory serves.

Two uses, both in the CLI: finding a running server to send commands to (``reef_core.cli.remote``),
and refusing to act on the state with a configuration other than the one it was served with
(``check_given``): ``reef grow`` with the wrong runtime would otherwise consume feedback and
learn nothing from it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import tempfile
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from .config import mask_secrets
from .errors import ConfigError

if TYPE_CHECKING:
    from .config import Settings

log = logging.getLogger("reef")

FILE_NAME = "served-config.json"
#: the settings that decide what a growth step does with the state's experience and releases
LEARNING_KEYS = ("runtime", "recipe", "evaluator", "artifact_store", "scenarios", "record_store")
FORMAT = 1


#: how this process's ``reef serve`` composed its configuration (``record_composition``); None
#: for servers built otherwise (the test server), which then record no ``composed_from``
_composition: dict[str, Any] | None = None


def record_composition(config_file: str | None, overrides: tuple[str, ...] | list[str]) -> None:
    """Remember the config file and overrides ``reef serve`` composed its settings from, for
    ``announce``; an override whose key is a secret's, or whose value holds a URL password,
    is left out (``complete: false``): the file is masked as a whole."""
    global _composition
    from .config import is_secret_key

    kept, complete = [], True
    for word in overrides:
        key, _, value = word.partition("=")
        if is_secret_key(key.lstrip("+~")) or mask_secrets(value) != value or _holds_secret(word):
            complete = False
            continue
        kept.append(word)
    _composition = {"cwd": os.getcwd(), "config_file": str(Path(config_file).resolve()) if config_file else None,
                    "overrides": kept, "complete": complete}


def _holds_secret(word: str) -> bool:
    """Whether an override's value is a mapping or list with a secret inside
    (``recipe.proposer={url: …, api_key: …}``), read as Hydra reads it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        value = OverridesParser.create().parse_override(word).value()
    except Exception:  # not an override Hydra reads: `reef serve` refuses it anyway
        return False
    return isinstance(value, (dict, list)) and mask_secrets(value) != value


class ConfigMismatch(ConfigError):
    """The configuration given differs from the one the state directory was last served with."""


def learning_view(settings: Settings) -> dict[str, Any]:
    """The learning-relevant settings, secrets masked (what is hashed and compared)."""
    data = settings.model_dump(mode="json")
    view = {key: data[key] for key in LEARNING_KEYS if key != "record_store"}
    view["record_store"] = {"url": settings.record_store_url}
    return mask_secrets(view)


def view_hash(view: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(view, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def connect_url(host: str, port: int) -> str | None:
    """The URL a client on this machine reaches a server bound to ``host:port`` at (None for
    port 0: the port is picked at bind time and not known here)."""
    if not port:
        return None
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


_ABSENT = object()


def differences(served: dict[str, Any], given: dict[str, Any], *, keys: tuple[str, ...] = LEARNING_KEYS,
                limit: int = 6) -> list[str]:
    """``key: served X, given Y`` for each leaf that differs under the top-level ``keys`` (at
    most ``limit``, then how many more). A plugin group whose ``name`` differs is that one line:
    its options belong to different plugins."""
    a, b = _flatten({k: served.get(k) for k in keys}), _flatten({k: given.get(k) for k in keys})
    renamed = {k for k in keys if a.get(f"{k}.name", _ABSENT) != b.get(f"{k}.name", _ABSENT)}
    out = []
    for key in sorted(set(a) | set(b)):
        left, right = a.get(key, _ABSENT), b.get(key, _ABSENT)
        group = key.split(".", 1)[0]
        if left == right or (group in renamed and key != f"{group}.name"):
            continue
        shown = ["absent" if v is _ABSENT else repr(v) for v in (left, right)]
        out.append(f"{key}: served {shown[0]}, given {shown[1]}")
    if len(out) > limit:
        out[limit:] = [f"and {len(out) - limit} more"]
    return out


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except OSError:
        return False
    return True


@dataclass
class ServedConfig:
    """The parsed file (``data``) of a state directory."""

    path: Path
    data: dict[str, Any]

    @classmethod
    def read(cls, state_dir: Path) -> ServedConfig | None:
        """The state directory's file, or None when there is none (or it cannot be parsed:
        logged, and treated as absent, since it is only a record)."""
        path = Path(state_dir) / FILE_NAME
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s: %s", path, exc)
            return None
        return cls(path, data) if isinstance(data, dict) else None

    @property
    def url(self) -> str | None:
        return self.data.get("url")

    def server_alive(self) -> bool:
        """Whether the server that wrote it says it runs and its process is alive on this machine,
        serving this directory: a copy of a state directory (``cp -a``), or one moved, carries the
        file of the server that serves the original, which is not this directory's server."""
        return (bool(self.data.get("running")) and self.data.get("hostname") == socket.gethostname()
                and self.serves_own_directory() and _pid_alive(self.data.get("pid")))

    def serves_own_directory(self) -> bool:
        """Whether the state directory the file names is the one it was read from."""
        named = self.data.get("state_dir")
        try:
            return isinstance(named, str) and Path(named).resolve() == self.path.parent.resolve()
        except OSError:
            return False

    def recompose(self, plugins: Any) -> Settings | None:
        """The settings the server was composed with, composed again here from its
        ``composed_from`` (in its state directory, whatever this process's working directory),
        or None when the file has none, its config file is gone, or the result's learning
        settings are not the served ones (a secret override left out, a file changed since)."""
        from .config import compose, validate

        source = self.data.get("composed_from")
        state_dir = self.data.get("state_dir")
        if not isinstance(source, dict) or not state_dir:
            return None
        config_file = source.get("config_file")
        if config_file and not Path(config_file).is_file():
            return None
        overrides = [*source.get("overrides", []), f"server.state_dir={state_dir}"]
        try:
            settings = validate(compose(overrides, plugins, config_file=config_file), plugins)
        except Exception as exc:  # a plugin gone or a key renamed since: fall back to the config given
            log.debug("cannot compose the served configuration of %s again: %s", self.path, exc)
            return None
        if view_hash(learning_view(settings)) != self.data.get("learning_hash"):
            return None
        return settings

    def mismatch(self, settings: Settings, *, keys: tuple[str, ...] = LEARNING_KEYS) -> list[str]:
        """How ``settings`` differ from the served ones under ``keys`` (empty when they agree)."""
        served = self.data.get("learning") or {}
        given = learning_view(settings)
        if keys == LEARNING_KEYS and self.data.get("learning_hash") == view_hash(given):
            return []
        found = differences(served, given, keys=keys)
        if not found and keys == LEARNING_KEYS:  # a file of another format: the hashes tell
            found = ["the learning settings (their hashes differ)"]
        return found


def check_given(settings: Settings, *, force: bool = False, keys: tuple[str, ...] = LEARNING_KEYS) -> None:
    """Refuse (``ConfigMismatch``, exit 2) to act locally on a state directory with settings that
    differ from the ones it was last served with; a state never served passes."""
    served = ServedConfig.read(settings.state_dir)
    if force or served is None:
        return
    found = served.mismatch(settings, keys=keys)
    if found:
        raise ConfigMismatch(
            f"{settings.state_dir} was last served with another configuration ({'; '.join(found)}): "
            "pass the overrides and config file the server uses, or --force to act with these settings")


def note_differences(served: ServedConfig, settings: Settings) -> str | None:
    """A note for a command sent to a running server that was given other settings: the
    server's apply."""
    found = served.mismatch(settings)
    if not found:
        return None
    return f"the running server's configuration applies, not the one given ({'; '.join(found)})"


def _write(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON in one step (temp file, fsync, ``os.replace``): a reader sees the
    old file or the new one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class Announcement:
    """A server's entry in its state directory, from ``announce`` until ``stopped()``."""

    def __init__(self, path: Path, data: dict[str, Any]):
        self.path = path
        self.data = data

    def stopped(self) -> None:
        """Mark the file ``running: false``, unless another server has written it since (one
        that shares the state directory and started later)."""
        try:
            current = ServedConfig.read(self.path.parent)
            if current is None or current.data.get("instance") != self.data["instance"]:
                return
            _write(self.path, {**self.data, "running": False, "stopped_at": _now()})
        except OSError as exc:
            log.warning("could not mark %s stopped: %s", self.path, exc)


def announce(settings: Settings, *, url: str | None) -> Announcement | None:
    """Write ``served-config.json`` for a server starting now with ``settings``, reachable at
    ``url`` (None when unknown: then the CLI cannot find it and acts on the state directly).
    A failure to write is logged, not raised: serving goes on."""
    from . import __version__

    view = learning_view(settings)
    data = {
        "format": FORMAT,
        "instance": uuid.uuid4().hex,
        "running": True,
        "url": url,
        "host": httpx.URL(url).host if url else None,
        "port": httpx.URL(url).port if url else None,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "started_at": _now(),
        "stopped_at": None,
        "reef_version": __version__,
        "state_dir": str(settings.state_dir),
        "default_scenario": settings.server.default_scenario,
        "learning_hash": view_hash(view),
        "learning": view,
        "settings": mask_secrets(settings.model_dump(mode="json")),
        **({"composed_from": _composition} if _composition is not None else {}),
    }
    path = settings.state_dir / FILE_NAME
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, data)
    except OSError as exc:
        log.warning("could not write %s (the CLI will not find this server): %s", path, exc)
        return None
    if _composition is not None:  # `reef serve`: a command run where it started finds it
        from .served_dirs import remember

        remember(settings.state_dir, started_at=data["started_at"], cwd=Path(_composition["cwd"]))
    return Announcement(path, data)
