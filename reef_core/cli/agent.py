"""``reef harness adapters`` and ``reef agent install|run|report|update``: coding agents as Reef clients.

``install`` fetches the server's installer for an agent adapter (``GET
/reef/harness/install?adapter=NAME``) and runs it on a project directory; ``run`` starts the
agent there with a fresh session id, so all its turns form one ``x-reef-session``, then lists
the receipts that session produced and keeps them; ``report`` sends one report quoting the
last run's receipts (its ``report_id`` is the session's, so a retry never reports twice);
``update`` re-installs when the scenario serves a newer release than the one installed.

The server is ``--url`` (``REEF_URL``), else the running one the other commands find (the one
started in this directory, else the configured state directory's: ``common.load_served``),
else ``http://127.0.0.1:8900``. The token is ``REEF_TOKEN``: passed to the agent through its
environment, never written into the project's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import click

from .common import friendly, load_served

if TYPE_CHECKING:
    import httpx

DEFAULT_URL = "http://127.0.0.1:8900"
#: the cache ``scripts/agent-clis.sh`` installs the pinned agent CLIs in (``REEF_AGENT_CLI_DIR``)
AGENT_CLI_DIR = "~/.cache/reef-agents/npm"

_url = click.option("--url", envvar="REEF_URL", show_envvar=True,
                    help=f"The Reef server (default: the one this machine runs, else {DEFAULT_URL}).")
_scenario = click.option("-s", "--scenario", envvar="REEF_SCENARIO", show_envvar=True,
                         help="Scenario (default: the installed one, else the server's default).")


class AgentError(click.ClickException):
    """A failure the user can act on, printed as one line (exit 1)."""


class ServerUnreachable(AgentError):
    """The Reef server could not be reached: exit 2, as every command that needs a server."""

    exit_code = 2


def _server_url(url: str | None) -> str:
    if url:
        return url.rstrip("/")
    from ..errors import ReefError
    from .remote import find_server

    try:  # the server started here (or on the configured state directory), as every command finds it
        settings, _plugins, served = load_served((), None)
        found = find_server(settings, url=None, token=None, served=served)
    except ReefError:
        found = None
    return found.url if found is not None else DEFAULT_URL


def _headers(scenario: str | None, session: str | None = None) -> dict[str, str]:
    token = os.environ.get("REEF_TOKEN")
    headers = {"authorization": f"Bearer {token}"} if token else {}
    if scenario:
        headers["x-reef-scenario"] = scenario
    if session:
        headers["x-reef-session"] = session
    return headers


def _request(method: str, url: str, *, headers: dict[str, str], attempts: int = 1,
             accept: tuple[int, ...] = (), **kwargs: Any) -> httpx.Response:
    """One call to the server; connection failures and 5xx are retried ``attempts`` times; an
    error status in ``accept`` is returned instead of raised."""
    import httpx

    for attempt in range(attempts):
        try:
            response = httpx.request(method, url, headers=headers, timeout=60, **kwargs)
        except httpx.HTTPError as exc:
            if attempt + 1 < attempts:
                time.sleep(0.5 * 2 ** attempt)
                continue
            from ..config import mask_url_text

            raise ServerUnreachable(f"cannot reach the Reef server at {mask_url_text(url)}: {type(exc).__name__}: "
                                    f"{mask_url_text(str(exc))}") from None
        if response.status_code >= 500 and attempt + 1 < attempts:
            time.sleep(0.5 * 2 ** attempt)
            continue
        if response.status_code >= 400 and response.status_code not in accept:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:300]
            from ..config import mask_url_text

            raise AgentError(f"the server answered {response.status_code} to {method} {mask_url_text(url)}: {message}")
        return response
    raise AssertionError("unreachable")


def sidecar(name: str) -> str:
    """The file agent ``name``'s installer records its release in (each adapter its own, so
    Claude Code, Codex and opencode live side by side in one project)."""
    return f".reef-harness-{name}-release"


def manifest(name: str) -> str:
    """The file agent ``name``'s installer lists what it installed in (``sha256sum -c`` format)."""
    return f".reef-harness-{name}.sha256"


def installed(directory: Path, name: str) -> dict[str, str]:
    """What agent ``name``'s installer recorded in ``directory`` (release_id, content_hash,
    scenario), or {} when it is not installed there."""
    path = directory / sidecar(name)
    if not path.is_file():
        return {}
    pairs = (line.partition("=") for line in path.read_text(encoding="utf-8", errors="replace").splitlines())
    return {k: v for k, _, v in pairs if k}


def files_intact(directory: Path, name: str) -> bool:
    """Whether every file agent ``name``'s manifest lists is in ``directory`` with its checksum
    (an update that trusts the release record alone said "already current" over deleted files)."""
    try:
        lines = (directory / manifest(name)).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    for line in lines:
        digest, sep, rel = line.partition("  ")
        if not sep:
            continue
        try:
            if hashlib.sha256((directory / rel).read_bytes()).hexdigest() != digest:
                return False
        except OSError:
            return False
    return True


def _adapters() -> dict[str, Any]:
    from ..plugins import get_plugins

    plugins = get_plugins()
    return {name: plugins.get("harness_adapter", name) for name in plugins.names("harness_adapter")}


def _agent_adapter(name: str) -> Any:
    adapters = _adapters()
    cls = adapters.get(name)
    if cls is None or not getattr(cls, "binary", ""):
        agents = ", ".join(n for n, c in adapters.items() if getattr(c, "binary", "")) or "none"
        raise AgentError(f"no agent adapter {name!r}; installed: {agents} (see `reef harness adapters`)")
    return cls


#: the records every adapter's installer kept before each agent kept its own
LEGACY_RECORDS = (".reef-harness.sha256", ".reef-harness-release")
#: how a legacy manifest shows which agent wrote it: a path only that agent's layout has
_LEGACY_OWNER = (("CLAUDE.md", "claude"), (".claude/", "claude"), (".codex/", "codex"),
                 ("opencode.json", "opencode"), (".opencode/", "opencode"))


def adopt_legacy_records(name: str, directory: Path) -> bool:
    """Rename the records an earlier install of agent ``name`` left under the shared names
    (``.reef-harness.sha256``, ``.reef-harness-release``) to its own, so its next install
    updates the files it wrote instead of refusing them as not installed by Reef. Only when
    the manifest lists that agent's layout and the agent has no records of its own yet."""
    legacy, release = (directory / n for n in LEGACY_RECORDS)
    if not legacy.is_file() or (directory / manifest(name)).exists():
        return False
    text = legacy.read_text(encoding="utf-8", errors="replace")
    paths = [line.split("  ", 1)[1] for line in text.splitlines() if "  " in line]
    owners = {owner for path in paths for prefix, owner in _LEGACY_OWNER
              if path == prefix or (prefix.endswith("/") and path.startswith(prefix))}
    if owners != {name}:
        return False
    os.replace(legacy, directory / manifest(name))
    if release.is_file():
        os.replace(release, directory / sidecar(name))
    return True


def install(name: str, directory: Path, *, url: str, scenario: str | None) -> str:
    """Run the server's installer for adapter ``name`` on ``directory``; the installer's output.
    Records an earlier install of ``name`` left under the shared names are adopted first."""
    if directory.is_dir():
        adopt_legacy_records(name, directory)
    response = _request("GET", f"{url}/reef/harness/install", params={"adapter": name},
                        headers=_headers(scenario), attempts=3)
    from ..builtins.harness_files import INSTALLER_END

    if not response.text.rstrip().endswith(INSTALLER_END):
        # a body cut short (a proxy closing without a length) or not an installer at all: never run
        raise AgentError(f"the server's answer is not a whole Reef installer (it does not end with {INSTALLER_END!r});"
                         " nothing was run; retry, or check --url")
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False, encoding="utf-8") as f:
        f.write(response.text)
    try:
        done = subprocess.run(["sh", f.name, str(directory)], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise AgentError((done.stderr or done.stdout).strip() or f"the installer failed ({done.returncode})")
    return done.stdout.strip()


def _state_file(directory: Path) -> Path:
    home = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    key = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]
    return home / "reef" / "agent-runs" / f"{key}.json"


def agent_binary(binary: str) -> str:
    """``binary`` as found on ``PATH``, else in the cache of pinned agent CLIs that
    ``scripts/agent-clis.sh`` fills (``$REEF_AGENT_CLI_DIR``, default ``~/.cache/reef-agents/npm``:
    its ``node_modules/.bin``), else as given (running it then says it is missing)."""
    import shutil

    if os.sep in binary or shutil.which(binary):
        return binary
    cache = Path(os.environ.get("REEF_AGENT_CLI_DIR") or AGENT_CLI_DIR).expanduser() / "node_modules" / ".bin"
    cached = cache / binary
    return str(cached) if cached.is_file() and os.access(cached, os.X_OK) else binary


def _agent_command(name: str, binary: str, scenario: str, session: str, args: list[str],
                   release_id: str | None = None) -> list[str]:
    if name == "claude":  # layered over .claude/settings.json, whose headers it replaces: adds the session
        headers = f"x-reef-scenario: {scenario}\nx-reef-session: {session}"
        if release_id:
            headers += f"\nx-reef-installed-release: {release_id}"
        return [binary, "--settings", json.dumps({"env": {"ANTHROPIC_CUSTOM_HEADERS": headers}}), *args]
    return [binary, *args]


def run(name: str, directory: Path, args: list[str], *, url: str, scenario: str | None,
        binary: str | None = None) -> dict[str, Any]:
    """Run agent ``name`` in ``directory`` as one session; the run (session, receipts, exit code).
    Refused, before anything starts, when ``name`` is not installed there."""
    from ..commit.harness import NO_RELEASE

    cls = _agent_adapter(name)
    adopt_legacy_records(name, directory)
    have = installed(directory, name)
    if not have:
        raise AgentError(f"{name} is not installed in {directory}: run `reef agent install {name} {directory}` first")
    scenario = scenario or have.get("scenario")
    if not scenario:
        raise AgentError(f"{directory / sidecar(name)} names no scenario: pass -s SCENARIO (or re-install)")
    session = f"{name}-{uuid.uuid4().hex[:16]}"
    # PWD too: opencode takes its project directory from $PWD, not from the process's cwd
    env = {**os.environ, "REEF_SESSION": session, "REEF_TOKEN": os.environ.get("REEF_TOKEN") or "none",
           "PWD": str(directory.resolve())}
    if name == "codex":
        env.setdefault("CODEX_HOME", str((directory / ".codex").resolve()))
    release_id = have.get("release_id") if have.get("release_id") != NO_RELEASE else None
    command = _agent_command(name, binary or agent_binary(cls.binary), scenario, session, args, release_id)
    run_info: dict[str, Any] = {"agent": name, "directory": str(directory.resolve()), "url": url, "scenario": scenario,
                                "session": session, "exit_code": None, "receipts": None}
    # this run is the last one from now on: a report after a failed receipt lookup must not land on the one before
    _save_run(directory, run_info)
    try:
        code = subprocess.call(command, cwd=directory, env=env)
    except FileNotFoundError:
        raise AgentError(f"{command[0]!r} is not installed: not on PATH nor in {AGENT_CLI_DIR}/node_modules/.bin "
                         "(scripts/agent-clis.sh installs the pinned CLIs there; --bin names another)") from None
    run_info["exit_code"] = code
    _save_run(directory, run_info)
    run_info["receipts"] = _session_receipts(url, scenario, session)
    _save_run(directory, run_info)
    return run_info


def _save_run(directory: Path, run_info: dict[str, Any]) -> None:
    state = _state_file(directory)
    state.parent.mkdir(parents=True, exist_ok=True)
    tmp = state.with_suffix(".tmp")
    tmp.write_text(json.dumps(run_info, indent=2), encoding="utf-8")
    tmp.replace(state)


def _session_receipts(url: str, scenario: str, session: str) -> list[str]:
    page = _request("GET", f"{url}/reef/scenarios/{quote(scenario, safe='')}/records",
                    params={"session": session, "order": "oldest", "limit": 500},
                    headers=_headers(scenario), attempts=3).json()
    return [r["id"] for r in page["records"]]


def report(directory: Path, *, score: float | None, feedback: str | None, url: str | None) -> dict[str, Any]:
    """One report quoting the receipts of the last run in ``directory``."""
    state = _state_file(directory)
    if not state.is_file():
        raise AgentError(f"no agent run recorded for {directory}; run `reef agent run NAME` there first")
    last = json.loads(state.read_text(encoding="utf-8"))
    if last["receipts"] is None:  # the run's lookup failed (the server away after the agent ran): now
        last["receipts"] = _session_receipts((url or last["url"]).rstrip("/"), last["scenario"], last["session"])
        _save_run(directory, last)
    if not last["receipts"]:
        raise AgentError(f"the last run (session {last['session']}) produced no receipts: nothing to report on")
    body: dict[str, Any] = {"references": last["receipts"], "report_id": f"agent-run-{last['session']}",
                            "metadata": {"agent": last["agent"], "session": last["session"]}}
    if score is not None:
        body["score"] = score
    if feedback is not None:
        body["feedback"] = feedback
    return _request("POST", f"{(url or last['url']).rstrip('/')}/reef/report", json=body,
                    headers=_headers(last["scenario"]), attempts=4).json()


def update(name: str, directory: Path, *, url: str, scenario: str | None) -> str:
    """Re-install when the scenario serves a release other than the installed one."""
    from ..commit.harness import NO_RELEASE

    adopt_legacy_records(name, directory)
    have = installed(directory, name)
    scenario = scenario or have.get("scenario")
    head = _request("GET", f"{url}/reef/harness", headers=_headers(scenario), attempts=3, accept=(404,))
    serving = head.headers.get("x-reef-release-id") if head.status_code == 200 else NO_RELEASE
    if serving and serving == have.get("release_id") and files_intact(directory, name):
        if serving == NO_RELEASE:
            return f"{directory} is already current (scenario {scenario} has no release yet)"
        return f"{directory} is already current (release {serving})"
    return install(name, directory, url=url, scenario=scenario)


# ------------------------------------------------------------------ commands


@click.group("harness")
def harness_group() -> None:
    """Harness adapters: how a release is installed where an agent reads it."""


@harness_group.command("adapters")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@friendly
def adapters_cmd(as_json: bool) -> None:
    """List the installed harness adapters (GET /reef/harness/install?adapter=NAME)."""
    rows = [{"name": name, "agent": getattr(cls, "binary", "") or None,
             "description": getattr(cls, "description", None) or (cls.__doc__ or "").strip().splitlines()[0]}
            for name, cls in _adapters().items()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        click.echo(f"{row['name']:<10} {row['description']}")


@click.group("agent")
def agent_group() -> None:
    """Coding agents (claude, codex, opencode) as Reef clients: install, run, report, update."""


@agent_group.command("install")
@click.argument("name")
@click.argument("directory", default=".", type=click.Path(file_okay=False, path_type=Path))
@_url
@_scenario
@friendly
def install_cmd(name: str, directory: Path, url: str | None, scenario: str | None) -> None:
    """Install the scenario's harness for agent NAME into DIRECTORY (default: here)."""
    _agent_adapter(name)
    click.echo(install(name, directory, url=_server_url(url), scenario=scenario))


#: `reef agent run`'s own options, refused after NAME (before a `--`): there they would go to the agent
REEF_RUN_OPTIONS = ("-d", "--dir", "--bin", "--url", "-s", "--scenario")


@agent_group.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("name")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("-d", "--dir", "directory", default=".", type=click.Path(file_okay=False, path_type=Path),
              help="The project the harness is installed in (default: here).")
@click.option("--bin", "binary", help="The agent's command (default: its usual name on PATH, else in "
                                      f"{AGENT_CLI_DIR}/node_modules/.bin, where scripts/agent-clis.sh puts it).")
@_url
@_scenario
@friendly
def run_cmd(name: str, args: tuple[str, ...], directory: Path, binary: str | None, url: str | None,
            scenario: str | None) -> None:
    """Run agent NAME (after `--`, its own arguments) as one Reef session; print its receipts."""
    if args and args[0] != "--" and "--" in args:
        own = [a for a in args[:args.index("--")] if a.split("=", 1)[0] in REEF_RUN_OPTIONS]
        if own:  # `reef agent run codex --url U -- …` would hand --url to the agent and ask the default server
            raise click.UsageError(f"{' '.join(own)} after NAME would go to the agent; put Reef's options before "
                                   f"NAME: reef agent run [OPTIONS] {name} -- ARGS")
    args_list = list(args[1:] if args and args[0] == "--" else args)
    info = run(name, directory, args_list, url=_server_url(url), scenario=scenario, binary=binary)
    click.echo(f"reef: session {info['session']}: {len(info['receipts'])} receipt(s)", err=True)
    for receipt in info["receipts"]:
        click.echo(f"reef: receipt {receipt}", err=True)
    sys.exit(info["exit_code"])


@agent_group.command("report")
@click.option("--score", type=float, help="A score for the whole run.")
@click.option("--feedback", help="What went well or wrong.")
@click.option("-d", "--dir", "directory", default=".", type=click.Path(file_okay=False, path_type=Path),
              help="The project the agent ran in (default: here).")
@_url
@friendly
def report_cmd(score: float | None, feedback: str | None, directory: Path, url: str | None) -> None:
    """Report on the last run's receipts (one report; a retry never reports twice)."""
    if score is None and feedback is None:
        raise click.UsageError("give --score, --feedback or both")
    out = report(directory, score=score, feedback=feedback, url=url)
    click.echo(f"reef: report {out['report_id']} on {len(out['references'])} receipt(s)")


@agent_group.command("update")
@click.argument("name")
@click.argument("directory", default=".", type=click.Path(file_okay=False, path_type=Path))
@_url
@_scenario
@friendly
def update_cmd(name: str, directory: Path, url: str | None, scenario: str | None) -> None:
    """Re-install agent NAME's harness in DIRECTORY when a newer release serves."""
    _agent_adapter(name)
    click.echo(update(name, directory, url=_server_url(url), scenario=scenario))


COMMANDS = (harness_group, agent_group)
