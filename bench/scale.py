"""Several ``reef serve`` processes on one PostgreSQL: records/s and growth-step latency with 1,
2 and 3 servers side by side.

    python bench/scale.py [--pg-url postgresql://...] [--seconds 5] [--concurrency 16] [--steps 4]

For each server count, a fresh database and release chain; the servers share both (and one
fast stub upstream, ``bench/proxy_overhead.py``'s). Traffic: ``--concurrency`` keep-alive
connections spread evenly over the servers, each sending chat completions for ``--seconds``;
every answer is a durable record, counted back from the database afterwards. Growth: one
request and one report through server ``i``, then ``POST /reef/scenarios/default/grow`` through
server ``i+1`` (the ``always`` evaluator, so each step proposes, takes the lease, publishes and
releases it), timed end to end.

Reported per count: records/s, request latency p50, the growth step's latency (p50 and max),
records per CPU-second of the Reef servers, and the CPU cores each part used during the traffic
window (Reef servers, PostgreSQL, the stub, this load generator, and the whole machine with
every other tenant), which says what bounds the throughput on a small machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import sqlalchemy as sa
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import Conn, cpu_seconds, free_port, process_stats, stat_cpu, wait_http  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BODY = b'{"model":"stub","messages":[{"role":"user","content":"What is the capital of France?"}]}'


def postgres_cpu() -> float:
    """user+system CPU seconds of every PostgreSQL process on this machine (server and backends)."""
    return sum(stat_cpu(fields) for name, fields in process_stats().values() if name.startswith("postgres"))


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (``/proc/stat``), every tenant included."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / tick, sum(fields) / tick


class Database:
    """A fresh database on the server at ``url``, dropped on ``drop``."""

    def __init__(self, url: str):
        from reef_core.store.engine import normalize_url

        base = normalize_url(url)
        self.admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
        self.name = f"reef_scale_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as c:
            c.exec_driver_sql(f'CREATE DATABASE "{self.name}"')
        self.url = base.rsplit("/", 1)[0] + f"/{self.name}"

    def drop(self) -> None:
        with self.admin.connect() as c:
            c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self.admin.dispose()


def start_servers(n: int, tmp: Path, pg_url: str, stub_port: int) -> list[tuple[subprocess.Popen, int]]:
    config = {
        "recipe": {"name": "feedback_rules", "batch_size": 1000, "max_score": 0.5, "proposer": None},
        "evaluator": {"name": "always"},
        "loop": {"enabled": True, "schedule_s": None},
        "record_store": {"url": pg_url},
        "artifact_store": {"name": "git", "path": str(tmp / "artifacts.git")},
    }
    cfg = tmp / "reef.yaml"
    cfg.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
    servers = []
    for i in range(n):
        port = free_port()
        with open(tmp / f"serve-{i}.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "reef_core", "serve", "-c", str(cfg), f"server.port={port}",
                                     f"server.state_dir={tmp / f's{i}'}", f"runtime.upstream_url=http://127.0.0.1:{stub_port}/v1",
                                     "runtime.model=stub", "server.log_level=warning"],
                                    env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        servers.append((proc, port))
        if i == 0 and not wait_http(port, "/healthz", proc):  # the first one creates the release chain
            raise RuntimeError(f"server 0 did not start:\n{(tmp / 'serve-0.log').read_text()[-3000:]}")
    for i, (proc, port) in enumerate(servers):
        if not wait_http(port, "/healthz", proc):
            raise RuntimeError(f"server {i} did not start:\n{(tmp / f'serve-{i}.log').read_text()[-3000:]}")
    return servers


async def traffic(ports: list[int], concurrency: int, seconds: float) -> tuple[int, int, list[float]]:
    """(answers, errors, latencies) of ``concurrency`` connections spread over ``ports``."""
    deadline = time.perf_counter() + seconds
    latencies: list[float] = []
    errors = 0

    async def worker(port: int) -> None:
        nonlocal errors
        conn = Conn("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                try:
                    status, _, total = await conn.post("/v1/chat/completions", BODY, b"")
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    errors += 1
                    conn.close()
                    continue
                if status == 200:
                    latencies.append(total)
                else:
                    errors += 1
        finally:
            conn.close()

    await asyncio.gather(*(worker(ports[k % len(ports)]) for k in range(concurrency)))
    return len(latencies), errors, latencies


def growth_steps(ports: list[int], steps: int) -> tuple[list[float], list[str]]:
    """Latency and outcome of ``steps`` growth steps, each triggered through another server
    than the one that took its report."""
    latencies, outcomes = [], []
    clients = [httpx.Client(base_url=f"http://127.0.0.1:{p}", timeout=120) for p in ports]
    try:
        for s in range(steps):
            via, grow = clients[s % len(clients)], clients[(s + 1) % len(clients)]
            r = via.post("/v1/chat/completions", content=BODY, headers={"content-type": "application/json"})
            r.raise_for_status()
            via.post("/reef/report", json={"references": [r.headers["x-reef-agent-record-id"]], "score": 0.0,
                                           "feedback": f"Rule {s}: answer in one short sentence"}).raise_for_status()
            t0 = time.perf_counter()
            g = grow.post("/reef/scenarios/default/grow")
            latencies.append(time.perf_counter() - t0)
            outcomes.append(g.json().get("outcome", str(g.status_code)))
    finally:
        for c in clients:
            c.close()
    return latencies, outcomes


def run_count(n: int, args: argparse.Namespace, stub: subprocess.Popen, stub_port: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"reef-scale-{n}-"))
    db = Database(args.pg_url)
    servers: list[tuple[subprocess.Popen, int]] = []
    try:
        servers = start_servers(n, tmp, db.url, stub_port)
        ports = [port for _, port in servers]
        asyncio.run(traffic(ports, args.concurrency, 1.0))  # warm-up (connections, caches, first records)
        engine = sa.create_engine(db.url)
        with engine.connect() as c:
            before = c.exec_driver_sql("SELECT count(*) FROM records").scalar()
        cpu0 = ([cpu_seconds(p.pid) for p, _ in servers], postgres_cpu(), cpu_seconds(stub.pid), time.process_time(),
                machine_busy()[0])
        t0 = time.perf_counter()
        answers, errors, lat = asyncio.run(traffic(ports, args.concurrency, args.seconds))
        wall = time.perf_counter() - t0
        cpu1 = ([cpu_seconds(p.pid) for p, _ in servers], postgres_cpu(), cpu_seconds(stub.pid), time.process_time(),
                machine_busy()[0])
        deadline = time.monotonic() + 30  # the record writers flush in groups: wait for the last ones
        while True:
            with engine.connect() as c:
                stored = c.exec_driver_sql("SELECT count(*) FROM records").scalar() - before
            if stored >= answers or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        engine.dispose()
        step_lat, outcomes = growth_steps(ports, args.steps)
        return {
            "servers": n, "rps": stored / wall, "answers": answers, "stored": stored, "errors": errors,
            "p50_ms": statistics.median(lat) * 1000 if lat else float("nan"),
            "step_p50_ms": statistics.median(step_lat) * 1000, "step_max_ms": max(step_lat) * 1000,
            "outcomes": outcomes,
            "cpu_reef": (sum(cpu1[0]) - sum(cpu0[0])) / wall, "cpu_pg": (cpu1[1] - cpu0[1]) / wall,
            "cpu_stub": (cpu1[2] - cpu0[2]) / wall, "cpu_client": (cpu1[3] - cpu0[3]) / wall,
            "cpu_machine": (cpu1[4] - cpu0[4]) / wall,
        }
    finally:
        for proc, _ in servers:
            proc.terminate()
        for proc, _ in servers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        db.drop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg-url", default=os.environ.get("REEF_TEST_POSTGRES_URL"),
                    help="a PostgreSQL server to create the databases on (default: $REEF_TEST_POSTGRES_URL)")
    ap.add_argument("--servers", default="1,2,3", help="server counts to measure, comma-separated")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of the traffic window")
    ap.add_argument("--concurrency", type=int, default=16, help="connections, spread over the servers")
    ap.add_argument("--steps", type=int, default=4, help="growth steps timed per server count")
    args = ap.parse_args()
    if not args.pg_url:
        ap.error("no PostgreSQL: pass --pg-url or set REEF_TEST_POSTGRES_URL (scripts/postgres.sh starts one)")
    stub_port = free_port()
    stub = subprocess.Popen([sys.executable, str(Path(__file__).with_name("proxy_overhead.py")), "--stub",
                             str(stub_port)], cwd=ROOT)
    try:
        if not wait_http(stub_port, "/v1/models", stub):
            raise RuntimeError("the stub upstream did not start")
        print(f"{os.cpu_count()} CPUs; {args.concurrency} connections for {args.seconds:.0f} s; "
              f"{args.steps} growth steps per count", flush=True)
        rows = []
        for n in (int(x) for x in args.servers.split(",")):
            row = run_count(n, args, stub, stub_port)
            rows.append(row)
            print(f"{n} server(s): {row['rps']:.0f} records/s ({row['stored']} stored of {row['answers']} answers, "
                  f"{row['errors']} errors), p50 {row['p50_ms']:.1f} ms; growth step p50 {row['step_p50_ms']:.0f} ms, "
                  f"max {row['step_max_ms']:.0f} ms ({', '.join(row['outcomes'])}); CPU cores: reef "
                  f"{row['cpu_reef']:.2f}, postgres {row['cpu_pg']:.2f}, stub {row['cpu_stub']:.2f}, "
                  f"client {row['cpu_client']:.2f}; the whole machine {row['cpu_machine']:.2f} of "
                  f"{os.cpu_count()}", flush=True)
        print("\nservers | records/s | vs 1 | p50 ms | step p50 ms | step max ms | records per reef CPU-s | "
              "cores: reef / pg / stub / client / machine")
        for row in rows:
            print(f"{row['servers']:>7} | {row['rps']:>9.0f} | x{row['rps'] / rows[0]['rps']:.2f} | "
                  f"{row['p50_ms']:>6.1f} | {row['step_p50_ms']:>11.0f} | {row['step_max_ms']:>11.0f} | "
                  f"{row['rps'] / row['cpu_reef']:>22.0f} | {row['cpu_reef']:.2f} / {row['cpu_pg']:.2f} / "
                  f"{row['cpu_stub']:.2f} / {row['cpu_client']:.2f} / {row['cpu_machine']:.2f}")
    finally:
        stub.terminate()
        stub.wait(15)


if __name__ == "__main__":
    main()
