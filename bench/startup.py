"""Start-up of ``reef serve`` in front of an upstream (no local model): time to healthy and RSS.

    python bench/startup.py [--runs 5] [--baseline DIR]

Starts the proxy bench's stub upstream, then ``reef serve`` ``--runs`` times on a fresh state
dir each (the first run creates and migrates the store; the rest open it, as a restart
does), polling ``/healthz`` every 10 ms. Reported per target: the median seconds from
process start to the first healthy answer, and the process's RSS at that moment; with
``--baseline DIR`` a Reef from another source tree runs alternately in the same loop (ratios
printed). Targets from the serving-overhead issue: ≤ 1.5 s warm, ≤ 120 MB.
"""

from __future__ import annotations

import argparse
import os
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
from proxy_overhead import check_source, free_port, status_memory, wait_http  # noqa: E402


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return r.status == 200
    except Exception:
        return False


def one_start(env: dict, state: Path, upstream: str, timeout: float = 60) -> tuple[float, float]:
    port = free_port()
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "from reef_core.cli import main; main()", "serve",
                             f"server.port={port}", f"server.state_dir={state}", f"runtime.upstream_url={upstream}",
                             "server.log_level=warning"], env=env, stdout=subprocess.DEVNULL,
                            cwd=state.parent)  # not a checkout: ``-c`` puts the cwd first on sys.path
    try:
        while not healthy(port):
            if proc.poll() is not None or time.perf_counter() - started > timeout:
                raise SystemExit(f"reef serve did not become healthy (exit code {proc.poll()})")
            time.sleep(0.01)
        return time.perf_counter() - started, status_memory(proc.pid)["VmRSS"] / 2**20
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="also start Reef from this source tree, alternately")
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "REEF_PLUGINS": "", "REEF_TOKEN": "sk-reef-startup-bench",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    targets = {"reef": env}
    if args.baseline:
        targets["base"] = {**env, "PYTHONPATH": os.pathsep.join([str(args.baseline.resolve()), env["PYTHONPATH"]])}
    tmp = Path(tempfile.mkdtemp(prefix="reef-startup-"))
    if args.baseline:
        check_source(targets["base"], tmp, args.baseline)
    stub_port = free_port()
    stub = subprocess.Popen([sys.executable, str(root / "bench" / "proxy_overhead.py"), "--stub", str(stub_port)],
                            env=env)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    try:
        if not wait_http(stub_port, "/v1/models", stub):
            raise SystemExit("the stub upstream did not start")
        for name, target_env in targets.items():  # warm the page cache and bytecode; not counted
            one_start(target_env, tmp / f"{name}-warm", f"http://127.0.0.1:{stub_port}")
        for i in range(args.runs):
            for name, target_env in targets.items():
                results[name].append(one_start(target_env, tmp / f"{name}-{i}", f"http://127.0.0.1:{stub_port}"))
    finally:
        stub.send_signal(signal.SIGTERM)
        stub.wait(15)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.runs} starts per target, fresh state dir each; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'target':<8} {'healthy s (median)':>19} {'min':>6} {'RSS MB (median)':>16}")
    med = {}
    for name, runs in results.items():
        secs, rss = [r[0] for r in runs], [r[1] for r in runs]
        med[name] = (statistics.median(secs), statistics.median(rss))
        print(f"{name:<8} {med[name][0]:>19.2f} {min(secs):>6.2f} {med[name][1]:>16.0f}")
    if "base" in med:
        print(f"reef/base: time to healthy x{med['reef'][0] / med['base'][0]:.2f}, RSS x{med['reef'][1] / med['base'][1]:.2f}")
    print(f"startup: healthy in {med['reef'][0]:.2f} s (target <= 1.5), RSS {med['reef'][1]:.0f} MB (target <= 120)")


if __name__ == "__main__":
    main()
