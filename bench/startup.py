"""Start-up of the ``reef`` commands: ``--help``, ``config``, ``plugins``, and ``serve`` in front of an upstream.

    python bench/startup.py [--runs 5] [--baseline DIR] [--no-plugins]

Every command runs with the plugins installed (all five recipes in this repository), as a user
runs it; ``--no-plugins`` sets ``REEF_PLUGINS=`` (built-ins only). Each target imports its
packages from its own tree: ``reef_core``, ``plugins/*`` and ``reef_recipe_*`` go first on
``PYTHONPATH``, so a ``--baseline`` tree runs its own recipes too (the bench stops otherwise).

Reported per target, median and minimum of ``--runs``, the runs of the targets interleaved:
the seconds from process start to exit for ``reef --help``, ``reef config``, ``reef config
recipe=sao`` (a weight recipe's options checked against its class, which imports no torch) and
``reef plugins``; for ``reef serve`` (the default config: record-only recipe ``basic``, runtime
``upstream`` on the proxy bench's stub) the seconds to the first healthy ``/healthz`` (polled
every 10 ms; a fresh state dir each time, so each start creates and migrates the store) and the
RSS then; and for each, the process's CPU seconds (user + system), which a busy machine changes
less than the wall time. With ``--baseline DIR`` a Reef from another source tree (a ``git
worktree`` of an older commit) runs alternately, and ``base/reef`` says how many times faster
this tree is.
Targets (issue 28): ``--help`` <= 0.5 s, ``config`` <= 1 s, ``plugins`` <= 1.5 s, ``serve``
healthy <= 1.5 s and <= 120 MB (the serving-overhead issue).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import free_port, status_memory, wait_http  # noqa: E402

ENTRY = "from reef_core.cli import main; main()"
COMMANDS = {"--help": ("--help",), "config": ("config",), "config recipe=sao": ("config", "recipe=sao", "evaluator=always"),
            "plugins": ("plugins",)}
TARGETS_S = {"--help": 0.5, "config": 1.0, "config recipe=sao": 1.0, "plugins": 1.5, "serve": 1.5}


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return r.status == 200
    except Exception:
        return False


def source_path(tree: Path) -> list[str]:
    """``tree`` and each of its installable packages' directories, for ``PYTHONPATH``."""
    return [str(tree), *(str(p) for p in sorted([*tree.glob("plugins/*/"), *tree.glob("reef_recipe_*/")])
                         if (p / p.name / "__init__.py").is_file())]


def check_sources(env: dict, cwd: Path, tree: Path) -> None:
    """Stop unless a Reef started with ``env`` in ``cwd`` imports reef_core and every package of
    ``tree`` from ``tree``: an old-against-new run that ran the same code twice reports noise."""
    names = ["reef_core", *(Path(p).name for p in source_path(tree)[1:])]
    code = f"import importlib\nfor n in {names!r}:\n    print(importlib.import_module(n).__file__)"
    found = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True)
    paths = found.stdout.split()
    outside = [f for f in paths if not Path(f).resolve().is_relative_to(tree.resolve())]
    if found.returncode != 0 or len(paths) != len(names) or outside:
        raise SystemExit(f"a Reef of {tree} would import from elsewhere: {outside or found.stderr.strip()}")


def cpu_of_child(before: resource.struct_rusage) -> float:
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cpu_of(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` has used so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_command(env: dict, cwd: Path, argv: tuple[str, ...]) -> tuple[float, float]:
    """(wall seconds to exit, CPU seconds) of ``reef ARGV``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", ENTRY, *argv], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=300)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"reef {' '.join(argv)} failed: {done.stderr.strip()}")
    return took, cpu_of_child(before)


def one_start(env: dict, state: Path, upstream: str, timeout: float = 60) -> tuple[float, float, float]:
    """(wall seconds to healthy, CPU seconds until then, RSS MB then) of ``reef serve``."""
    port = free_port()
    state.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, "serve",
                             f"server.port={port}", f"server.state_dir={state}", f"runtime.upstream_url={upstream}",
                             "server.log_level=warning"], env=env, stdout=subprocess.DEVNULL,
                            cwd=state.parent)  # not a checkout: ``-c`` puts the cwd first on sys.path
    try:
        while not healthy(port):
            if proc.poll() is not None or time.perf_counter() - started > timeout:
                raise SystemExit(f"reef serve did not become healthy (exit code {proc.poll()})")
            time.sleep(0.01)
        return time.perf_counter() - started, cpu_of(proc.pid), status_memory(proc.pid)["VmRSS"] / 2**20
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="also run Reef from this source tree, alternately")
    ap.add_argument("--no-plugins", action="store_true", help="REEF_PLUGINS= (built-in plugins only)")
    args = ap.parse_args()
    # a weight recipe is there only with the plugins
    commands = {c: argv for c, argv in COMMANDS.items() if not (args.no_plugins and "recipe=" in c)}
    root = Path(__file__).resolve().parents[1]
    # PYTHONDONTWRITEBYTECODE (set on some images) would make a fresh --baseline worktree compile
    # its modules again on every run while this tree has cached bytecode: 1.1-1.25x in favour of
    # this tree on commands neither changed. Both trees cache bytecode, and the warm-up run fills it.
    env = {k: v for k, v in os.environ.items() if k not in ("REEF_PLUGINS", "PYTHONDONTWRITEBYTECODE")}
    env["REEF_TOKEN"] = "sk-reef-startup-bench"
    if args.no_plugins:
        env["REEF_PLUGINS"] = ""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    trees = {"reef": root, **({"base": args.baseline.resolve()} if args.baseline else {})}
    targets = {name: {**env, "PYTHONPATH": os.pathsep.join([*source_path(tree), *inherited])}
               for name, tree in trees.items()}
    tmp = Path(tempfile.mkdtemp(prefix="reef-startup-"))
    for name, tree in trees.items():
        check_sources(targets[name], tmp, tree)
    stub_port = free_port()
    stub = subprocess.Popen([sys.executable, str(root / "bench" / "proxy_overhead.py"), "--stub", str(stub_port)],
                            env=targets["reef"])
    upstream = f"http://127.0.0.1:{stub_port}"
    times: dict[str, dict[str, list[float]]] = {name: {c: [] for c in [*commands, "serve"]} for name in targets}
    cpu: dict[str, dict[str, list[float]]] = {name: {c: [] for c in [*commands, "serve"]} for name in targets}
    rss: dict[str, list[float]] = {name: [] for name in targets}
    try:
        if not wait_http(stub_port, "/v1/models", stub):
            raise SystemExit("the stub upstream did not start")
        for name, target_env in targets.items():  # warm the page cache and bytecode; not counted
            for argv in commands.values():
                one_command(target_env, tmp, argv)
            one_start(target_env, tmp / f"{name}-warm" / "state", upstream)
        for i in range(args.runs):
            for name, target_env in targets.items():
                for command, argv in commands.items():
                    secs, used = one_command(target_env, tmp, argv)
                    times[name][command].append(secs)
                    cpu[name][command].append(used)
                secs, used, mb = one_start(target_env, tmp / f"{name}-{i}" / "state", upstream)
                times[name]["serve"].append(secs)
                cpu[name]["serve"].append(used)
                rss[name].append(mb)
    finally:
        stub.send_signal(signal.SIGTERM)
        stub.wait(15)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.runs} runs per command and target, interleaved; "
          f"{'built-in plugins only' if args.no_plugins else 'every installed plugin'}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print("wall s: median / min of the runs; CPU s: median user+system of the process (what a busy machine "
          "changes least)")
    header = f"{'command':<21}" + "".join(f"{name + ' wall s':>17}{name + ' CPU s':>12}" for name in targets)
    print(header + (f"{'base/reef wall':>16}{'CPU':>7}" if "base" in targets else "") + f"{'target':>9}")
    for command in [*commands, "serve"]:
        shown = "reef " + command + (" (healthy)" if command == "serve" else "")
        row = f"{shown:<21}"
        med = {name: statistics.median(times[name][command]) for name in targets}
        med_cpu = {name: statistics.median(cpu[name][command]) for name in targets}
        for name in targets:
            row += f"{med[name]:>9.2f} / {min(times[name][command]):<5.2f}{med_cpu[name]:>12.2f}"
        if "base" in targets:
            row += f"{med['base'] / med['reef']:>15.2f}x{med_cpu['base'] / med_cpu['reef']:>6.2f}x"
        row += f"  <= {TARGETS_S[command]:<4} {'ok' if med['reef'] <= TARGETS_S[command] else 'OVER'}"
        print(row)
    print("serve RSS MB (median): " + ", ".join(f"{name} {statistics.median(mb):.0f}" for name, mb in rss.items())
          + " (target <= 120)")

if __name__ == "__main__":
    main()
