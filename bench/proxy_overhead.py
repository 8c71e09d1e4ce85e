"""Proxy overhead: direct to a stub model vs through Reef vs through the LiteLLM proxy.

    python bench/proxy_overhead.py [--seconds 3] [--rounds 3] [--no-litellm] [--no-responses] [--workers 1,2]
                                   [--baseline DIR]

Starts a fast stub upstream (raw ASGI under uvicorn), a ``reef serve`` in front of it (one
worker, SQLite, every record durable), and, when installed, a LiteLLM proxy whose
``model_list`` points at the same stub (no database). Each scenario — non-streaming and
streaming, at concurrency 1 and 32 — runs the three targets interleaved in short windows,
round after round, so drift (thermal, page cache, other tenants) hits all of them alike.

The load generator is a minimal keep-alive HTTP/1.1 client on asyncio streams: a heavier
client (httpx) would eat the CPU the servers need on a small machine. Reported per target:
requests/s, latency p50/p99, time to first byte for streams, latency added over direct, and
CPU seconds used by the target's processes per 1,000 requests (from /proc), the tail as
p99/p50, and — with ``--workers 1,2`` — one Reef per worker count (``reef``, ``reef-w2``, all
on one store kind, every record durable) with each one's throughput relative to one worker;
with ``--baseline DIR`` a Reef from another source tree (``git worktree add DIR REV``) runs as
``base`` beside the current one, so a change is measured old against new in one run.

The Responses pass-through (``runtime.dialect: responses``): the stub also speaks ``POST
/v1/responses`` (a response object, or OpenAI's event sequence for the same eight words), and a
second Reef in front of it as a Responses upstream runs as ``reef-resp``, its ``/v1/responses``
requests going through as they came; ``direct-resp`` is the stub's own ``/v1/responses``, so
``reef-resp``'s added latency is over that, and a last line sets it beside the chat route's.
``--no-responses`` leaves both out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_KEY = "sk-reef-bench-" + os.urandom(8).hex()

# ---------------------------------------------------------------------------- the stub upstream

_WORDS = [f"w{i} " for i in range(8)]


def _completion() -> bytes:
    return json.dumps({"id": "chatcmpl-stub", "object": "chat.completion", "created": 1, "model": "stub",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(_WORDS)},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}}).encode()


def _chunks(include_usage: bool) -> list[bytes]:
    base = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 1, "model": "stub"}

    def c(delta, finish=None):
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events = [c({"role": "assistant", "content": ""})] + [c({"content": w}) for w in _WORDS] + [c({}, "stop")]
    if include_usage:
        events.append({**base, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 8,
                                                        "total_tokens": 13}})
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def _response() -> dict:
    text = "".join(_WORDS)
    return {"id": "resp_stub", "object": "response", "created_at": 1, "status": "completed", "model": "stub",
            "output": [{"type": "message", "id": "msg_stub", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "usage": {"input_tokens": 5, "output_tokens": 8, "total_tokens": 13}}


def _response_events() -> list[bytes]:
    """OpenAI's event sequence for ``_response()``: 15 events."""
    done = _response()
    item = done["output"][0]
    part = {"type": "output_text", "text": "", "annotations": []}
    start = {**done, "status": "in_progress", "output": [], "usage": None}
    events = [{"type": "response.created", "response": start}, {"type": "response.in_progress", "response": start},
              {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
              {"type": "response.content_part.added", "item_id": "msg_stub", "output_index": 0, "content_index": 0,
               "part": part}]
    events += [{"type": "response.output_text.delta", "item_id": "msg_stub", "output_index": 0, "content_index": 0,
                "delta": w} for w in _WORDS]
    events += [{"type": "response.output_text.done", "item_id": "msg_stub", "output_index": 0, "content_index": 0,
                "text": "".join(_WORDS)},
               {"type": "response.output_item.done", "output_index": 0, "item": item},
               {"type": "response.completed", "response": done}]
    return [b"event: " + e["type"].encode() + b"\ndata: " + json.dumps({**e, "sequence_number": i}).encode() + b"\n\n"
            for i, e in enumerate(events)]


async def stub_app(scope, receive, send):
    """An OpenAI-compatible model that answers instantly (8 words; streams 11 events), on Chat
    Completions and on the Responses API."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    if scope["path"].endswith("/models"):
        payload = b'{"object":"list","data":[{"id":"stub","object":"model"}]}'
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})
        return
    req = json.loads(body or b"{}")
    responses = scope["path"].endswith("/responses")
    if not req.get("stream"):
        payload = json.dumps(_response()).encode() if responses else _completion()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    chunks = _response_events() if responses else _chunks(bool((req.get("stream_options") or {}).get("include_usage")))
    for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def run_stub(port: int) -> None:
    import uvicorn

    uvicorn.run("bench.proxy_overhead:stub_app" if __package__ else stub_app, host="127.0.0.1", port=port,
                log_level="warning", access_log=False)


# ---------------------------------------------------------------------------- a lean HTTP/1.1 client


class Conn:
    """One keep-alive HTTP/1.1 connection; ``post`` returns (status, first-byte s, total s)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.authority = f"{host}:{port}".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, headers: bytes) -> tuple[int, float, float]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        t0 = time.perf_counter()
        self.writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\nhost: " + self.authority
                          + b"\r\ncontent-type: application/json\r\n"
                          + headers + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        first = None
        if b"transfer-encoding: chunked" in lower:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                await self.reader.readexactly(size + 2)
                if first is None:
                    first = time.perf_counter() - t0
                if size == 0:
                    break
        else:
            i = lower.index(b"content-length:") + 15
            n = int(lower[i:lower.index(b"\r\n", i)])
            await self.reader.readexactly(n)
            first = time.perf_counter() - t0
        total = time.perf_counter() - t0
        if b"connection: close" in lower:
            self.close()
        return status, first, total

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


@dataclass
class Window:
    latencies: list[float] = field(default_factory=list)
    first_bytes: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    cpu: float = 0.0


async def load(port: int, path: str, body: bytes, headers: bytes, concurrency: int, seconds: float) -> Window:
    win = Window()
    deadline = time.perf_counter() + seconds

    async def worker():
        conn = Conn("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                try:
                    status, first, total = await conn.post(path, body, headers)
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    win.errors += 1
                    conn.close()
                    continue
                if status != 200:
                    win.errors += 1
                    continue
                win.latencies.append(total)
                win.first_bytes.append(first)
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    win.seconds = time.perf_counter() - t0
    return win


# ---------------------------------------------------------------------------- processes and CPU


def process_stats() -> dict[int, tuple[str, list[str]]]:
    """Every process on this machine: pid -> (command name, the ``/proc/<pid>/stat`` fields after it)."""
    stats: dict[int, tuple[str, list[str]]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        stats[int(d)] = (raw[raw.index("(") + 1:raw.rindex(")")], raw[raw.rindex(")") + 2:].split())
    return stats


def status_memory(pid: int | str = "self") -> dict[str, int]:
    """Memory lines of ``/proc/<pid>/status`` in bytes: the resident set (VmRSS, split into
    RssAnon, the heap, and RssFile, mapped files) and its peak (VmHWM)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def stat_cpu(fields: list[str]) -> float:
    """user+system CPU seconds from a process's stat fields."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user+system CPU of ``pid`` and its descendants."""
    stats = process_stats()
    children: dict[int, list[int]] = {}
    for p, (_, fields) in stats.items():
        children.setdefault(int(fields[1]), []).append(p)
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += stat_cpu(stats[p][1])
        todo += children.get(p, [])
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port: int, path: str, proc: subprocess.Popen, timeout: float = 120) -> bool:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                if r.status < 500:
                    return True
        except Exception:
            time.sleep(0.2)
    return False


@dataclass
class Target:
    name: str
    port: int
    path: str
    proc: subprocess.Popen | None
    headers: bytes = b""

    @property
    def responses(self) -> bool:
        """Whether this target is measured on ``/v1/responses`` (its ``direct`` is ``direct-resp``)."""
        return self.path.endswith("/responses")


def check_source(env: dict, cwd: Path, tree: Path) -> None:
    """Stop unless a Reef started with ``env`` in ``cwd`` imports reef_core from ``tree``: an
    old-against-new run that quietly ran the same code twice would report noise as a result."""
    found = subprocess.run([sys.executable, "-c", "import reef_core; print(reef_core.__file__)"], env=env, cwd=cwd,
                           capture_output=True, text=True).stdout.strip()
    if Path(found).resolve().parent.parent != tree.resolve():
        raise SystemExit(f"the baseline Reef would import reef_core from {found or 'nowhere'}, not from {tree}")


def start_targets(tmp: Path, with_litellm: bool, reef_state: Path | None = None,
                  reef_synchronous: str = "full", workers: tuple[int, ...] = (1,),
                  baseline: Path | None = None, responses: bool = True) -> tuple[list[Target], list[subprocess.Popen]]:
    procs = []
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    stub_port = free_port()
    stub = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--stub", str(stub_port)], env=env)
    procs.append(stub)
    if not wait_http(stub_port, "/v1/models", stub):
        raise SystemExit("the stub upstream did not start")
    targets = [Target("direct", stub_port, "/v1/chat/completions", stub)]

    # Both proxies check a bearer token on every request, as they would in production.
    reef_env = {**env, "REEF_PLUGINS": "", "REEF_TOKEN": BENCH_KEY}
    auth = b"authorization: Bearer " + BENCH_KEY.encode() + b"\r\n"
    reefs = [("reef" if n == 1 else f"reef-w{n}", n, reef_env, "openai") for n in workers]
    if baseline is not None:  # the same server from another source tree (e.g. a worktree of an older commit)
        reefs.append(("base", 1, {**reef_env, "PYTHONPATH": os.pathsep.join([str(baseline.resolve()),
                                                                             reef_env["PYTHONPATH"]])}, "openai"))
        check_source(reefs[-1][2], tmp, baseline)
    if responses:  # the Responses pass-through: the same stub as a Responses upstream
        targets.append(Target("direct-resp", stub_port, "/v1/responses", stub))
        reefs.append(("reef-resp", 1, reef_env, "responses"))
    for name, n, target_env, dialect in reefs:
        reef_port = free_port()
        state = (reef_state / name) if reef_state else tmp / name
        # cwd: ``python -c`` puts the working directory first on sys.path, so started from a
        # checkout it would import that checkout's reef_core ahead of the baseline's.
        reef = subprocess.Popen([sys.executable, "-c", "from reef_core.cli import main; main()", "serve",
                                 f"server.port={reef_port}", f"server.state_dir={state}", f"server.workers={n}",
                                 f"runtime.upstream_url=http://127.0.0.1:{stub_port}", "server.log_level=warning",
                                 f"runtime.dialect={dialect}",
                                 f"record_store.synchronous={reef_synchronous}"],
                                env=target_env, cwd=tmp)
        procs.append(reef)
        if not wait_http(reef_port, "/readyz", reef):
            raise SystemExit(f"reef serve ({n} worker(s)) did not start")
        path = "/v1/responses" if dialect == "responses" else "/v1/chat/completions"
        targets.append(Target(name, reef_port, path, reef, auth))

    if with_litellm:
        exe = shutil.which("litellm") or str(Path(sys.executable).parent / "litellm")
        if not Path(exe).exists():
            print("LiteLLM proxy: not installed (pip install 'litellm[proxy]'); continuing without it")
        else:
            cfg = tmp / "litellm.yaml"
            cfg.write_text(
                "model_list:\n  - model_name: stub\n    litellm_params:\n      model: openai/stub\n"
                f"      api_base: http://127.0.0.1:{stub_port}/v1\n      api_key: unused\n"
                "litellm_settings:\n  telemetry: false\n  drop_params: true\n")
            lport = free_port()
            lenv = {**env, "LITELLM_LOG": "ERROR", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                    "DISABLE_SCHEMA_UPDATE": "true", "LITELLM_MASTER_KEY": BENCH_KEY}
            lenv.pop("DATABASE_URL", None)
            lite = subprocess.Popen([exe, "--config", str(cfg), "--port", str(lport), "--host", "127.0.0.1",
                                     "--num_workers", "1"], env=lenv, stdout=subprocess.DEVNULL,
                                    stderr=open(tmp / "litellm.log", "w"))
            procs.append(lite)
            if wait_http(lport, "/health/liveliness", lite, timeout=180):
                targets.append(Target("litellm", lport, "/v1/chat/completions", lite, auth))
            else:
                print(f"LiteLLM proxy: did not start (see {tmp / 'litellm.log'}); continuing without it")
    return targets, procs


# ---------------------------------------------------------------------------- the run


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def scenario(targets: list[Target], stream: bool, concurrency: int, seconds: float, rounds: int):
    chat = json.dumps({"model": "stub", "stream": stream,
                       "messages": [{"role": "user", "content": "Say eight words."}]}).encode()
    responses = json.dumps({"model": "stub", "stream": stream, "input": "Say eight words."}).encode()
    results = {t.name: [] for t in targets}
    for t in targets:  # warm-up: connections, caches, JIT-free but lazy imports
        await load(t.port, t.path, responses if t.responses else chat, t.headers, concurrency, min(1.0, seconds))
    for r in range(rounds):
        order = targets if r % 2 == 0 else list(reversed(targets))
        for t in order:
            before = cpu_seconds(t.proc.pid) if t.proc else 0.0
            win = await load(t.port, t.path, responses if t.responses else chat, t.headers, concurrency, seconds)
            win.cpu = (cpu_seconds(t.proc.pid) if t.proc else 0.0) - before
            results[t.name].append(win)
    return results


def summarize(results, stream: bool, concurrency: int) -> list[str]:
    merged = {}
    for name, wins in results.items():
        lat = [x for w in wins for x in w.latencies]
        fb = [x for w in wins for x in w.first_bytes]
        n = len(lat)
        secs = sum(w.seconds for w in wins)
        merged[name] = {"n": n, "rps": n / secs if secs else 0, "p50": pct(lat, 0.5) * 1e3,
                        "p99": pct(lat, 0.99) * 1e3, "fb50": pct(fb, 0.5) * 1e3,
                        "errors": sum(w.errors for w in wins),
                        "cpu_per_1k": (sum(w.cpu for w in wins) / n * 1000) if n else float("nan")}
    d = merged["direct"]
    one = merged.get("reef")
    lines = [f"\n## {'streaming' if stream else 'non-streaming'}, concurrency {concurrency}",
             f"{'target':<11} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'p99/p50':>7} {'ttfb50':>8} {'+p50 ms':>8} "
             f"{'+p99 ms':>8} {'+ttfb50':>8} {'cpu s/1k':>9} {'x 1 wkr':>7} {'errors':>6}"]
    for name, m in merged.items():
        add = not name.startswith("direct")
        over = merged["direct-resp"] if name.endswith("-resp") else d  # the same route, direct
        # Worker scaling: each Reef's throughput over the one-worker Reef's, measured in the same run.
        scaled = name.startswith("reef") and not name.endswith("-resp") and one and one["rps"]
        scale = f"{m['rps'] / one['rps']:>7.2f}" if scaled else f"{'':>7}"
        lines.append(f"{name:<11} {m['rps']:>8.0f} {m['p50']:>8.2f} {m['p99']:>8.2f} {m['p99'] / m['p50']:>7.1f} "
                     f"{m['fb50']:>8.2f} {(m['p50'] - over['p50']) if add else 0:>8.2f} "
                     f"{(m['p99'] - over['p99']) if add else 0:>8.2f} {(m['fb50'] - over['fb50']) if add else 0:>8.2f} "
                     f"{m['cpu_per_1k']:>9.2f} {scale} {m['errors']:>6}")
    if "litellm" in merged and "reef" in merged:
        r, lt = merged["reef"], merged["litellm"]
        lines.append(f"reef/litellm: throughput x{r['rps'] / lt['rps']:.2f}, added p50 "
                     f"{(r['p50'] - d['p50']):.2f} vs {(lt['p50'] - d['p50']):.2f} ms, "
                     f"cpu per request x{r['cpu_per_1k'] / lt['cpu_per_1k']:.2f}")
    if "reef-resp" in merged and "reef" in merged:
        r, rr, dr = merged["reef"], merged["reef-resp"], merged["direct-resp"]
        lines.append(f"responses pass-through/chat route: throughput x{rr['rps'] / r['rps']:.2f}, added p50 "
                     f"{(rr['p50'] - dr['p50']):.2f} vs {(r['p50'] - d['p50']):.2f} ms, "
                     f"cpu per request x{rr['cpu_per_1k'] / r['cpu_per_1k']:.2f}")
    if "base" in merged and "reef" in merged:
        r, b = merged["reef"], merged["base"]
        lines.append(f"reef/base: throughput x{r['rps'] / b['rps']:.2f}, added p50 "
                     f"{(r['p50'] - d['p50']):.2f} vs {(b['p50'] - d['p50']):.2f} ms, p99 {r['p99']:.2f} vs "
                     f"{b['p99']:.2f} ms, cpu per request x{r['cpu_per_1k'] / b['cpu_per_1k']:.2f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="length of one measurement window")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved windows per target and scenario")
    ap.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM proxy")
    ap.add_argument("--no-responses", action="store_true",
                    help="skip the Responses pass-through (reef-resp, direct-resp)")
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--modes", default="plain,stream", help="plain, stream or both (comma-separated)")
    ap.add_argument("--reef-synchronous", choices=["full", "normal"], default="full",
                    help="record_store.synchronous for Reef: full fsyncs every commit (the default), normal "
                         "survives a crash of Reef but not a power loss")
    ap.add_argument("--reef-state-dir", type=Path, help="Reef's state dir (e.g. on tmpfs, to see what "
                                                         "fsync costs); a fresh temporary one by default")
    ap.add_argument("--workers", default="1", help="server.workers of each Reef to start, comma-separated "
                                                     "(e.g. 1,2: the x 1 wkr column is the scaling)")
    ap.add_argument("--baseline", type=Path, help="also run Reef from this source tree (its reef_core first on "
                                                   "PYTHONPATH) as target 'base': old and new code side by side")
    ap.add_argument("--stub", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stub:
        run_stub(args.stub)
        return
    tmp = Path(tempfile.mkdtemp(prefix="reef-bench-"))
    workers = tuple(sorted({int(w) for w in args.workers.split(",")} | {1}))
    targets, procs = start_targets(tmp, not args.no_litellm, args.reef_state_dir, args.reef_synchronous, workers,
                                   args.baseline, not args.no_responses)
    print(f"targets: {', '.join(t.name for t in targets)}; {os.cpu_count()} CPUs; "
          f"{args.rounds} rounds x {args.seconds}s per target and scenario; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    try:
        modes = [m.strip() for m in args.modes.split(",")]
        for stream in [s for s, name in ((False, "plain"), (True, "stream")) if name in modes]:
            for c in (int(x) for x in args.concurrency.split(",")):
                res = asyncio.run(scenario(targets, stream, c, args.seconds, args.rounds))
                print("\n".join(summarize(res, stream, c)), flush=True)
                print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
