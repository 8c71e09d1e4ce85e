"""Three ``reef serve`` processes on one PostgreSQL and one release chain, behind loopback
ports: traffic and reports through all three land once; growth runs one step per scenario at
a time across them; a killed lease holder's step is taken over and settled, a paused one is
fenced and never publishes. And ``server.workers=2`` on one port and one SQLite store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from reef_core.store import RecordStore
from reef_core.testing import FakeUpstream

from .conftest import ask, capital_model, feedback_rules_config, report, wait_for, write_config
from .slow_gate import LAUNCHER, gate_runs

REPO = Path(__file__).resolve().parents[2]
GATE_S = 2.5
LEASE_TTL_S = 3
BATCH = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``reef serve`` process (with the slow_gate evaluator registered)."""

    def __init__(self, tmp_path: Path, name: str, cfg: Path, store_url: str, upstream: str, *overrides: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        with self.log_path.open("w") as log:  # a file, not a pipe: a chatty server never blocks on it
            self.proc = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, "serve", "-c", str(cfg), f"server.port={self.port}",
                 f"server.state_dir={tmp_path / name}", f"record_store.url={store_url}",
                 f"artifact_store.path={tmp_path / 'artifacts.git'}", f"runtime.upstream_url={upstream}",
                 "server.log_level=warning", *overrides],
                env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
        self.client = httpx.Client(base_url=self.url, timeout=60)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"reef serve exited with {self.proc.returncode}: {self.log_path.read_text()}")
        try:
            return self.client.get("/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _traffic(server: Server, tag: str, n: int, receipts: list[str]) -> None:
    """``n`` requests and one report per answer (each with new feedback: a new rule)."""
    for i in range(n):
        r = ask(server.client, f"What is the capital of France? ({tag}-{i})")
        receipt = r.headers["x-reef-agent-record-id"]
        receipts.append(receipt)
        report(server.client, [receipt], score=0.0, feedback=f"Rule {tag}-{i}: answer in one sentence")


def _unsettled(store: RecordStore) -> list:
    return store.candidates_with_status(("proposed", "evaluating", "selected"))


def _settled(store: RecordStore, timeout: float, batch: int = BATCH) -> None:
    """Wait until fewer reports than a batch are left (an explicit grow takes a smaller batch),
    no candidate is unsettled and no step holds the lease; say what is stuck if not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = store.counts("default")
        lease = store.get_lease("default")
        if (counts["reports"] - counts["consumed_reports"] < batch and not _unsettled(store)
                and (lease is None or lease.expires_at <= store.lease_clock())):  # no step between consume and row
            return
        time.sleep(0.1)
    states = [(c.id, c.status, c.lease_token, c.reason) for c in store.list_candidates("default")]
    pytest.fail(f"not settled: {store.counts('default')}; candidates {states}; "
                f"lease {store.get_lease('default')}")


def _running(gate_log: str, pids: set[int]) -> tuple[int, str] | None:
    """(pid, candidate id) of a gate run in progress in one of ``pids``."""
    for cid, run in gate_runs(gate_log).items():
        if run["end"] is None and run["pid"] in pids:
            return run["pid"], cid
    return None


def test_three_servers_share_one_postgres_and_grow_one_step_at_a_time(tmp_path, fresh_pg_url):
    gate_log = str(tmp_path / "gate.log")
    config = feedback_rules_config(batch_size=BATCH, evaluator={"name": "slow_gate", "seconds": GATE_S, "log": gate_log})
    config["loop"].update(lease_ttl_s=LEASE_TTL_S, lease_poll_s=0.3, schedule_s=2)
    cfg = write_config(tmp_path / "serve.yaml", config)
    store = RecordStore(fresh_pg_url)  # migrated once here; the servers find the schema ready
    with FakeUpstream("openai", capital_model) as up:
        # the first one creates the release chain's repository; the others start together
        servers = [Server(tmp_path, "s0", cfg, fresh_pg_url, up.url)]
        try:
            wait_for(servers[0].up, "the first server to start", timeout=120)
            servers += [Server(tmp_path, f"s{i}", cfg, fresh_pg_url, up.url) for i in (1, 2)]
            for server in servers:
                wait_for(server.up, f"server {server.port} to start", timeout=120)

            # traffic and reports through all three at once; growth triggered from each
            receipts: list[str] = []
            threads = [threading.Thread(target=_traffic, args=(s, f"a{i}", 4, receipts)) for i, s in enumerate(servers)]
            for t in threads:
                t.start()
            grown = [s.client.post("/reef/scenarios/default/grow") for s in servers]
            for t in threads:
                t.join()
            assert {g.status_code for g in grown} <= {200, 409}, [g.text for g in grown]
            _settled(store, 120)
            assert len(receipts) == 12 and len(set(receipts)) == 12
            assert set(store.get_records(receipts)) == set(receipts)
            counts = store.counts("default")
            assert counts["records"] == 12 and counts["reports"] == 12

            # kill -9 of the lease holder mid-step: another server takes over, the step never publishes
            pids = {s.pid for s in servers}
            _traffic(servers[0], "b", 4, [])
            holder_pid, killed = wait_for(lambda: _running(gate_log, pids), "a step in its gate")
            victim = next(s for s in servers if s.pid == holder_pid)
            os.kill(victim.pid, signal.SIGKILL)
            victim.proc.wait(timeout=30)
            survivors = [s for s in servers if s is not victim]
            _traffic(survivors[0], "c", 4, [])
            wait_for(lambda: store.get_candidate(killed) is not None
                     and store.get_candidate(killed).status == "error", "the killed step settled", timeout=120)
            assert store.get_candidate(killed).reason.startswith("interrupted")

            # a paused holder: its lease expires, another takes over; resumed, it is fenced
            wait_for(lambda: not _unsettled(store), "the survivors' steps decided", timeout=120)
            live = {s.pid for s in survivors}
            _traffic(survivors[0], "d", 4, [])
            paused_pid, paused = wait_for(lambda: _running(gate_log, live), "a step in its gate")
            os.kill(paused_pid, signal.SIGSTOP)
            other = next(s for s in survivors if s.pid != paused_pid)
            _traffic(other, "e", 4, [])
            wait_for(lambda: any(run["pid"] == other.pid and run["start"] > gate_runs(gate_log)[paused]["start"]
                                 for run in gate_runs(gate_log).values()),
                     "the other server's step after the lease expired", timeout=120)
            os.kill(paused_pid, signal.SIGCONT)
            wait_for(lambda: store.get_candidate(paused).status == "fenced", "the paused step fenced", timeout=120)
            wait_for(lambda: not _unsettled(store), "every step decided", timeout=120)

            candidates = store.list_candidates("default")
            published = {r.candidate_id for r in store.list_releases("default")}
            assert killed not in published and paused not in published
            assert {c.id for c in candidates if c.status == "published"} == published
            assert len(published) >= 3
            # nothing else was interrupted or fenced
            assert [c.id for c in candidates if (c.reason or "").startswith("interrupted")] == [killed]
            assert [c.id for c in candidates if c.status == "fenced"] == [paused]
            # one holding per step, and the steps holding a live lease never overlapped
            tokens = [c.lease_token for c in candidates]
            assert None not in tokens and len(set(tokens)) == len(tokens)
            runs = gate_runs(gate_log)
            spans = sorted((run["start"], run["end"]) for cid, run in runs.items() if cid not in (killed, paused))
            assert len(spans) == len(candidates) - 2
            for (_, end), (start, _) in zip(spans, spans[1:]):
                assert start >= end, spans
            # the pause outlived the lease: the taker's step started once it expired (renewed every third of it)
            assert any(run["start"] >= runs[paused]["start"] + LEASE_TTL_S * 2 / 3 for run in runs.values())
        finally:
            for server in servers:
                server.stop()
            store.close()


def _children(pid: int) -> set[int]:
    kids = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                raw = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(raw[raw.rindex(")") + 2:].split()[1]) == pid:
                kids.add(int(d))
    return kids


def test_server_workers_share_one_port_and_one_sqlite_store(tmp_path):
    """``server.workers=2`` on SQLite: both workers answer on the one port, every record lands
    once, growth steps take one lease each; a killed worker is replaced; SIGTERM stops them all."""
    gate_log = str(tmp_path / "gate.log")
    config = feedback_rules_config(batch_size=2, evaluator={"name": "slow_gate", "seconds": 0.5, "log": gate_log})
    config["loop"].update(lease_poll_s=0.3)
    cfg = write_config(tmp_path / "serve.yaml", config)
    with FakeUpstream("openai", capital_model) as up:
        server = Server(tmp_path, "w", cfg, f"sqlite:///{tmp_path / 'reef.db'}", up.url, "server.workers=2")
        try:
            wait_for(server.up, "the workers to start", timeout=120)
            workers = wait_for(lambda: len(_children(server.pid)) == 2 and _children(server.pid), "two workers")
            receipts: list[str] = []
            threads = [threading.Thread(target=_traffic, args=(server, f"w{i}", 4, receipts)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            store = RecordStore(f"sqlite:///{tmp_path / 'reef.db'}", migrate=False)
            _settled(store, 120, batch=2)
            assert len(set(receipts)) == 8 and set(store.get_records(receipts)) == set(receipts)
            assert store.counts("default")["records"] == 8
            candidates = store.list_candidates("default")
            assert candidates and len({c.lease_token for c in candidates}) == len(candidates)
            assert {c.status for c in candidates} <= {"published", "rejected"}
            spans = sorted((run["start"], run["end"]) for run in gate_runs(gate_log).values())
            for (_, end), (start, _) in zip(spans, spans[1:]):
                assert start >= end, spans
            store.close()

            victim = min(workers)
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: victim not in _children(server.pid) and len(_children(server.pid)) == 2,
                     "a replacement worker", timeout=60)
            wait_for(server.up, "the replacement serving", timeout=120)
            for _ in range(4):  # every request is answered whichever worker takes it
                ask(server.client, "What is the capital of Japan?")
            server.proc.terminate()
            assert server.proc.wait(timeout=60) == 0
            assert not _children(server.pid)
        finally:
            server.stop()
