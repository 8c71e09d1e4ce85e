"""Soak: Reef under a long, mixed load of hostile inputs and upstream faults.

    python bench/soak.py [--seconds 60] [--concurrency 8] [--seed 1] [--postgres URL]
                         [--subprocess] [--dialect openai|anthropic] [--fault-share 0.5]

Not a benchmark of speed: it runs the robustness suite's generators and fault injector for
longer than the tests can. ``tests/serve/inputs.py`` gives the hostile inputs (hypothesis
strategies of chat/messages bodies, x-reef headers, reports, paging cursors, query parameters
and record ids, drawn from a seeded producer thread); ``tests/serve/faults.py`` gives the
upstream fault injector (errors, hangs past ``runtime.timeout_s``, stalls, cut connections,
streams without their final event, 1,000-level answers, malformed JSON, HTML, empty and huge
answers, slow drips). Workers interleave the two against one Reef — in this process
(``ReefServer``) or a ``reef serve`` subprocess (``--subprocess``), on SQLite or on PostgreSQL
(``--postgres``, ``record_store.url``) — judge every answer as the tests do, read back every
record a receipt was given for (by id at once, and in its scenario's pages at the end), then
check ``/healthz``, ``/readyz`` and the record writer.

The last line is the summary: requests, faults injected, inputs tried, Reef-originated 5xx,
hangs (no answer within the bound, or a connection dropped without one), records lost
(answers with a receipt whose record cannot be read back) and wrong answers (shape, status),
with their rates. The first failures of each kind are printed above it. Exit status 1 when
anything failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "serve")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from faults import FAULTS, FaultUpstream, Shot, fire, record_status_of, verify_receipts  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from inputs import (  # noqa: E402
    BOUND_S,
    Body,
    ChatSpec,
    Ctx,
    Dropped,
    Hang,
    Lost,
    Req,
    ServerError,
    WriterDied,
    all_pages,
    chat_specs,
    cursors,
    get_record,
    header_specs,
    judge,
    record_ids,
    record_queries,
    report_specs,
    scenario_path,
    send,
)

# What one hostile input is: (kind, payload).
INPUTS = st.one_of(
    st.tuples(st.just("chat"), chat_specs("openai")),
    st.tuples(st.just("chat"), chat_specs("anthropic")),
    st.tuples(st.just("report"), report_specs),
    st.tuples(st.just("headers"), st.tuples(header_specs, st.sampled_from(["openai", "anthropic"]))),
    st.tuples(st.just("cursor"), cursors),
    st.tuples(st.just("query"), record_queries()),
    st.tuples(st.just("record_id"), record_ids),
)


class _TimeUp(BaseException):
    """Stops the hypothesis producer (a BaseException: hypothesis lets it through)."""


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    inputs: int = 0
    shots: int = 0
    receipts: int = 0
    failures: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    by_scenario: dict[str, set[str]] = field(default_factory=dict)

    def fail(self, kind: str, detail: str) -> None:
        with self.lock:
            self.failures[kind] += 1
            shown = self.examples.setdefault(kind, [])
            if len(shown) < 3:
                shown.append(detail[:600])

    def receipt(self, scenario: str, receipt: str) -> None:
        with self.lock:
            self.receipts += 1
            self.by_scenario.setdefault(scenario, set()).add(receipt)


KIND_OF = {"hang": "hang", "dropped": "hang", "writer_died": "hang", "reef_5xx": "reef_5xx", "lost": "lost",
           "unexpected": "wrong", "shape": "wrong"}


def classify(exc: AssertionError) -> str:
    if isinstance(exc, (Hang, WriterDied)):
        return "hang"
    if isinstance(exc, ServerError):
        return "reef_5xx"
    if isinstance(exc, Lost):
        return "lost"
    return "wrong"


# ---------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Target:
    """Reef in this process, or a ``reef serve`` subprocess."""

    def __init__(self, args: argparse.Namespace, upstream: FaultUpstream, state: Path):
        self.overrides = ["runtime.timeout_s=1", "runtime.connect_timeout_s=1", "server.max_scenarios=1000000",
                          "server.log_level=error"]
        if args.postgres:
            self.overrides.append(f"record_store.url={args.postgres}")
        self.proc: subprocess.Popen | None = None
        self.server = None
        if args.subprocess:
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            env = {**os.environ, "REEF_PLUGINS": "", "PYTHONPATH": str(ROOT)}
            env.pop("REEF_TOKEN", None)
            self.log = state.parent / "reef-serve.log"
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from reef_core.cli import main; main()", "serve", f"server.port={port}",
                 f"server.state_dir={state}", f"runtime.upstream_url={upstream.url}",
                 f"runtime.dialect={args.dialect}", *self.overrides], env=env,
                stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"reef serve did not start (see {self.log})")
                time.sleep(0.1)
        else:
            from reef_core.testing import ReefServer

            self.server = ReefServer(state, self.overrides, upstream=upstream.url, dialect=args.dialect,
                                     log_level="critical", graceful_s=2).start()
            # the upstream faults are logged by the thousand; the summary says what matters
            logging.getLogger("reef").setLevel(logging.CRITICAL)
            self.url = self.server.url

    def writer_alive(self) -> bool | None:
        return self.server.app.state.serve.writer.alive if self.server is not None else None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# ---------------------------------------------------------------------------- the load


def produce(inbox: queue.Queue, seed_value: int, deadline: float, stop: threading.Event) -> None:
    @seed(seed_value)
    @settings(max_examples=10**9, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(INPUTS)
    def draw(item):
        while True:
            if stop.is_set() or time.monotonic() > deadline:
                raise _TimeUp
            try:
                inbox.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    try:
        draw()
    except _TimeUp:
        pass


def worker(n: int, args: argparse.Namespace, target: Target, inbox: queue.Queue, tally: Tally, deadline: float,
           other: str, shots: list) -> None:
    rng = random.Random(args.seed * 1000 + n)
    scenario = f"soak-{n}"
    alive = target.writer_alive if target.server is not None else None
    client = httpx.Client(base_url=target.url, timeout=BOUND_S)
    own: list[str] = []
    faults = [f for f in FAULTS if f != "ok"]
    i = 0
    try:
        while time.monotonic() < deadline:
            i += 1
            if rng.random() < args.fault_share or not own:
                fault = "ok" if not own or rng.random() < 0.4 else rng.choice(faults)
                shot = Shot(n * 10_000_000 + i, rng.choice(["openai", "anthropic"]), rng.random() < 0.5, fault,
                            scenario)
                result = fire(client, shot)
                shots.append(result)
                with tally.lock:
                    tally.requests += 1
                    tally.shots += 1
                if result.problem:
                    tally.fail(KIND_OF[result.problem], f"fault {fault} stream={shot.stream}: {result.detail}")
                elif fault == "ok" and result.receipt:
                    own[:] = [result.receipt]
                if result.status is not None and result.status >= 500 and result.problem:
                    client.close()
                    client = httpx.Client(base_url=target.url, timeout=BOUND_S)
                continue
            try:
                kind, payload = inbox.get(timeout=1)
            except queue.Empty:
                continue
            with tally.lock:
                tally.requests += 1
                tally.inputs += 1
            try:
                one_input(client, kind, payload, Ctx(scenario, list(own), other), tally, alive)
            except AssertionError as exc:
                tally.fail(classify(exc), f"{kind}: {type(exc).__name__}: {exc}")
                if isinstance(exc, (ServerError, Dropped)):
                    client.close()
                    client = httpx.Client(base_url=target.url, timeout=BOUND_S)
    finally:
        client.close()


def one_input(client: httpx.Client, kind: str, payload, ctx: Ctx, tally: Tally, alive) -> None:
    """Send one hostile input, judge the answer, read back what it wrote (by id)."""
    if kind == "chat":
        req = payload.build(ctx)
        expected = [ctx.scenario]
    elif kind == "headers":
        headers, route = payload
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        req = ChatSpec(route, Body(body), False).build(ctx, headers=headers.headers())
        expected = headers.expected_scenario("default")
    elif kind == "report":
        req = payload.build(ctx)
        expected = [ctx.scenario]
    elif kind in ("cursor", "query"):
        params = [("cursor", payload)] if kind == "cursor" else payload
        req = Req("GET", f"/reef/scenarios/{scenario_path(ctx.scenario)}/records", params=params)
        expected = []
    else:
        req = Req("GET", f"/reef/records/{scenario_path(payload)}")
        expected = []
    answer = send(client, req, alive=alive)
    judge(req, answer)
    if answer.status != 200:
        return
    if req.kind == "chat":
        record = get_record(client, answer.receipt, wait_s=5)
        if record.get("scenario") not in expected:
            raise Lost(f"record {answer.receipt} is in scenario {record.get('scenario')!r}, not {expected!r}")
        if record.get("status") != record_status_of(answer):
            raise Lost(f"record {answer.receipt} has status {record.get('status')!r}, "
                       f"expected {record_status_of(answer)!r}")
        tally.receipt(record["scenario"], answer.receipt)
    elif req.kind == "report":
        out = answer.json()
        for ref in dict.fromkeys(out["references"]):
            record = get_record(client, ref)
            if out["report_id"] not in {r.get("id") for r in record.get("reports", [])}:
                raise Lost(f"report {out['report_id']} is missing from GET /reef/records/{ref}")
    elif kind in ("cursor", "query"):
        cursor = answer.json().get("next_cursor")
        base = [(k, v) for k, v in params if k != "cursor"]
        for _ in range(5):  # a few more pages must answer too (the tests page to the end)
            if cursor is None:
                break
            page = send(client, Req("GET", req.path, params=base + [("cursor", cursor)]), alive=alive)
            judge(req, page)
            if page.status != 200:
                raise Lost(f"page after cursor {cursor!r} answered {page.status}: {page.body[:200]!r}")
            cursor = page.json().get("next_cursor")


# ---------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to run the load")
    ap.add_argument("--concurrency", type=int, default=8, help="client threads")
    ap.add_argument("--seed", type=int, default=1, help="seeds the hostile inputs and the fault choices")
    ap.add_argument("--postgres", metavar="URL", help="record_store.url: run on PostgreSQL instead of SQLite")
    ap.add_argument("--subprocess", action="store_true", help="run `reef serve` in a subprocess (not in-process)")
    ap.add_argument("--dialect", choices=["openai", "anthropic"], default="openai", help="what the upstream speaks")
    ap.add_argument("--fault-share", type=float, default=0.5, help="share of requests that are fault shots")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="reef-soak-"))
    tally = Tally()
    shots: list = []
    with FaultUpstream(hang_s=3.0, huge_bytes=1 << 20) as upstream:
        target = Target(args, upstream, tmp / "reef")
        try:
            with httpx.Client(base_url=target.url, timeout=BOUND_S) as client:
                first = fire(client, Shot(0, "openai", False, "ok", "soak-other"))
                if first.status != 200:
                    raise SystemExit(f"Reef does not answer a plain request: {first.status} {first.detail}")
                other = first.receipt
                started = time.monotonic()
                deadline = started + args.seconds
                inbox: queue.Queue = queue.Queue(maxsize=4 * args.concurrency)
                stop = threading.Event()
                producer = threading.Thread(target=produce, args=(inbox, args.seed, deadline, stop), daemon=True)
                producer.start()
                workers = [threading.Thread(target=worker, args=(n, args, target, inbox, tally, deadline, other, shots))
                           for n in range(args.concurrency)]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
                stop.set()
                producer.join(30)
                elapsed = time.monotonic() - started

                # every receipt given for a fault shot: its record, by id and in its scenario's pages
                for r in verify_receipts(client, shots):
                    tally.fail("lost", f"fault {r.shot.fault}: {r.detail}")
                tally.receipts += sum(1 for r in shots if r.receipt)
                # every receipt given for a hostile input: in its scenario's pages
                for scenario, receipts in tally.by_scenario.items():
                    try:
                        listed = {rec["id"] for rec in all_pages(client, scenario, [("limit", "500")],
                                                                 max_pages=100_000)}
                    except AssertionError as exc:
                        listed = set()
                        tally.fail("lost", f"paging {scenario!r}: {exc}")
                    for receipt in receipts - listed:
                        tally.fail("lost", f"record {receipt} is missing from the pages of {scenario!r}")
                for path in ("/healthz", "/readyz"):
                    r = client.get(path)
                    if r.status_code != 200:
                        tally.fail("wrong", f"{path} answered {r.status_code} after the soak: {r.text[:200]}")
                if target.writer_alive() is False:
                    tally.fail("hang", "the record writer thread is dead after the soak")
        finally:
            target.stop()
        injected = sum(n for f, n in upstream.injected.items() if f != "ok")

    if args.subprocess:
        print(f"reef serve's log: {target.log}")
    for kind, shown in tally.examples.items():
        for line in shown:
            print(f"[{kind}] {line}", flush=True)
    f, req = tally.failures, max(tally.requests, 1)
    where = f"{'reef serve' if args.subprocess else 'in-process'}, {'PostgreSQL' if args.postgres else 'SQLite'}"
    print(f"soak ({where}, {args.dialect} upstream, seed {args.seed}, concurrency {args.concurrency}): "
          f"{elapsed:.0f}s, {tally.requests} requests ({tally.requests / elapsed:.1f}/s), "
          f"{injected} faults injected, {tally.inputs} inputs tried, "
          f"{f['reef_5xx']} Reef 5xx ({f['reef_5xx'] / req:.3%}), {f['hang']} hangs ({f['hang'] / req:.3%}), "
          f"{f['lost']} records lost of {tally.receipts} receipts ({f['lost'] / max(tally.receipts, 1):.3%}), "
          f"{f['wrong']} wrong answers ({f['wrong'] / req:.3%})", flush=True)
    sys.exit(1 if sum(f.values()) else 0)


if __name__ == "__main__":
    main()
