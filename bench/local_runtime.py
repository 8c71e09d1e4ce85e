"""Benchmark of the local runtime (reef-torch) on the embedded SmolLM2-135M-Instruct.

Not a test: it prints numbers, in one run, against these targets:

1. generation tokens/s through ``LocalRuntime.complete`` vs raw ``model.generate`` on the
   same model object in the same process (target ≥ 0.9×);
2. throughput with 8 concurrent requests vs the same 8 sent one after another (target ≥ 2×);
3. publish-to-serving latency of an adapter hot swap under continuous load (target ≤ 1 s),
   and the number of failed requests during it (target 0);
4. (with ``--rss-requests N``) resident memory over N short requests at concurrency 8: RSS
   idle, after a warm-up (the plateau), every ``--rss-every`` requests and at the end, the
   final/plateau ratio (target ≤ 1.3×) and the process's peak (VmHWM);
5. (with ``--long``, on its own) agent-sized prompts through a real ``reef serve runtime=local``
   (``/v1/messages``, as Claude Code sends them): the server process's peak RSS for one prompt
   of the largest size the model's context takes (``--long-tokens``; targets ≤ 1.5 GB) and for
   ``--concurrent`` of them at once (≤ 3 GB), then the same for prompts past the context
   (``--over-tokens``, 12k by default), which must be refused with a 400 naming the limit.
   With ``--baseline DIR`` (a source tree of another commit, e.g. ``git archive REV | tar -x
   -C DIR``) the same cases run on a server from that tree first, side by side.

Usage:  HF_HUB_OFFLINE=1 python bench/local_runtime.py [--tokens 64] [--rounds 3]
        HF_HUB_OFFLINE=1 python bench/local_runtime.py --rss-requests 1000 --rss-only
        HF_HUB_OFFLINE=1 python bench/local_runtime.py --long [--baseline DIR] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import status_memory  # noqa: E402

PROMPTS = [
    "Write a long story about a dragon who learns to cook.",
    "Explain in detail how a bicycle works.",
    "Describe the history of the printing press.",
    "Give me a detailed plan for a trip to Japan.",
    "Explain photosynthesis step by step.",
    "Write a poem about the sea and the stars.",
    "Describe how to bake bread at home.",
    "Explain how computers store numbers.",
]


def memory() -> dict[str, int]:
    """This process's resident set now (VmRSS: RssAnon, the heap, plus RssFile, mostly the memory-mapped
    weights, paged in by the first forward) and its peak (VmHWM), in bytes, from /proc."""
    return status_memory()


def mb(n: int) -> str:
    return f"{n / 2**20:7.0f} MB"


def split(m: dict[str, int]) -> str:
    return f"{mb(m['VmRSS'])} (anon {mb(m['RssAnon']).strip()}, file {mb(m['RssFile']).strip()})"


def body(prompt: str, tokens: int, **extra) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": tokens, **extra}


async def timed_complete(rt, prompt: str, tokens: int, scenario: str = "bench") -> tuple[int, float, dict]:
    from reef_core.types import InferenceCall

    call = InferenceCall(scenario=scenario, record_id="bench", body=body(prompt, tokens))
    start = time.perf_counter()
    out = await rt.complete(call)
    return out["usage"]["completion_tokens"], time.perf_counter() - start, call.extras


def raw_generate(rt, prompt: str, tokens: int) -> tuple[int, float]:
    """``model.generate`` on the runtime's own model object (the engine is idle meanwhile)."""
    import torch

    tok, model = rt.tokenizer, rt.engine.model
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"].to(model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    return out.shape[1] - ids.shape[1], time.perf_counter() - start


def make_adapter(model_dir: Path, out: Path, seed: int) -> Path:
    """A small LoRA for SmolLM2 (one training step: any weights do for timing a swap)."""
    from reef_train import Sample
    from reef_train.testing import word_learner

    learner = word_learner(model_dir, lr=1e-3, include_lm_head=False, seed=seed, r=8)
    learner.step([Sample(prompt_ids=[1, 2, 3, 4], response_ids=[5, 6, 7], advantage=1.0)])
    return learner.save(out) / "adapter"


async def rss_phase(rt, idle: dict[str, int], requests: int, tokens: int, warmup: int, every: int) -> None:
    """Resident memory under ``requests`` requests from 8 looping clients (prompts of varied length)."""
    done = 0
    samples: list[int] = []
    lock = asyncio.Lock()

    async def run(n: int, report: bool) -> None:
        nonlocal done
        todo = iter(range(n))

        async def client(i: int) -> None:
            nonlocal done
            for k in todo:
                # vary prompt and completion lengths so rows of different widths join and leave the batch
                j = i * 7 + k
                prompt = PROMPTS[j % len(PROMPTS)] + " Please be precise." * (j % 5)
                await timed_complete(rt, prompt, tokens - (j % 4) * (tokens // 8))
                async with lock:
                    done += 1
                    if report and done % every == 0:
                        now = memory()
                        samples.append(now["VmRSS"])
                        print(f"   after {done:5d} requests : {split(now)}")

        await asyncio.gather(*(client(i) for i in range(8)))

    print(f"\n4. resident memory, {requests} requests x {tokens} tokens at concurrency 8 "
          f"(after a {warmup}-request warm-up)")
    print(f"   idle (model loaded)  : {split(idle)}")
    start = time.perf_counter()
    await run(warmup, report=False)
    after_warmup = memory()
    plateau = after_warmup["VmRSS"]
    print(f"   after warm-up        : {split(after_warmup)}   (the plateau)")
    done = 0
    await run(requests, report=True)
    elapsed = time.perf_counter() - start
    final = memory()
    print(f"   final                : {split(final)}")
    print(f"   ratio final/plateau {final['VmRSS'] / plateau:.2f}x (target <= 1.3x; heap alone "
          f"{final['RssAnon'] / after_warmup['RssAnon']:.2f}x); highest sample {mb(max(samples, default=final['VmRSS']))}")
    print(f"   peak (VmHWM)         : {mb(final['VmHWM'])}")
    print(f"   {requests + warmup} requests in {elapsed:.0f} s ({(requests + warmup) / elapsed:.1f} req/s)")
    await asyncio.sleep(2.0)  # the engine tidies up once it goes idle
    print(f"   idle again (2 s later): {split(memory())}")


async def main(tokens: int, rounds: int, rss_requests: int = 0, rss_only: bool = False, rss_tokens: int = 16,
               rss_warmup: int = 64, rss_every: int = 100) -> None:
    from reef_core.types import ActiveRelease, InferenceCall
    from reef_torch import LocalRuntime

    rt = LocalRuntime(max_batch_size=8, batch_window_ms=8)
    t0 = time.perf_counter()
    await rt.start()
    idle = memory()
    print(f"model {rt.model_id} on {rt.loaded.device} ({rt.loaded.dtype}) ready in {time.perf_counter() - t0:.1f} s; "
          f"torch threads={__import__('torch').get_num_threads()}; RSS {mb(idle['VmRSS']).strip()}")
    if rss_only:
        await rss_phase(rt, idle, rss_requests, rss_tokens, rss_warmup, rss_every)
        await rt.aclose()
        return
    await timed_complete(rt, PROMPTS[0], 8)  # warm-up
    raw_generate(rt, PROMPTS[0], 8)

    # 1. runtime vs raw generate, single sequence, alternating to share any drift
    rt_rates, raw_rates = [], []
    for i in range(rounds):
        prompt = PROMPTS[i % len(PROMPTS)]
        n, dt = raw_generate(rt, prompt, tokens)
        raw_rates.append(n / dt)
        n, dt, _ = await timed_complete(rt, prompt, tokens)
        rt_rates.append(n / dt)
    raw, ours = statistics.median(raw_rates), statistics.median(rt_rates)
    # pairs run back to back, so the median of per-pair ratios is robust to a busy machine
    paired = statistics.median(o / r for o, r in zip(rt_rates, raw_rates))
    print(f"\n1. single-sequence generation ({tokens} new tokens, greedy, median of {rounds} interleaved pairs)")
    print(f"   raw model.generate : {raw:7.1f} tok/s")
    print(f"   runtime.complete   : {ours:7.1f} tok/s   ratio {paired:.2f}x (median per-pair; target >= 0.9x)")

    # 2. 8 concurrent vs 8 sequential
    start = time.perf_counter()
    seq_tokens = 0
    for p in PROMPTS:
        n, _, _ = await timed_complete(rt, p, tokens)
        seq_tokens += n
    seq = seq_tokens / (time.perf_counter() - start)
    rt.engine.forward_log.clear()
    start = time.perf_counter()
    results = await asyncio.gather(*(timed_complete(rt, p, tokens) for p in PROMPTS))
    conc = sum(n for n, _, _ in results) / (time.perf_counter() - start)
    sizes = [n for kind, n in rt.engine.forward_log if kind == "decode"]
    print(f"\n2. throughput, {len(PROMPTS)} requests x {tokens} tokens")
    print(f"   sequential : {seq:7.1f} tok/s")
    print(f"   concurrent : {conc:7.1f} tok/s   ratio {conc / seq:.2f}x (target >= 2x); "
          f"decode batch sizes max {max(sizes)}, mean {statistics.mean(sizes):.1f}")

    # 3. hot swap under continuous load
    tmp = Path(tempfile.mkdtemp(prefix="reef-bench-"))
    releases = []
    for i in (1, 2):
        art = tmp / f"r{i}"
        make_adapter(rt.base_model().path, art, seed=i)
        releases.append(ActiveRelease(scenario="bench", release_id=f"r{i}", path=art))
    await rt.activate(releases[0])
    stop = asyncio.Event()
    served: list[tuple[float, str | None]] = []
    failures: list[str] = []

    async def client(i: int) -> None:
        while not stop.is_set():
            try:
                _, _, extras = await timed_complete(rt, PROMPTS[i], 16)
                served.append((time.perf_counter(), extras["adapter"]))
            except Exception as exc:  # noqa: BLE001 - counted, not raised: the number is the result
                failures.append(repr(exc))

    clients = [asyncio.create_task(client(i)) for i in range(6)]
    await asyncio.sleep(2.0)
    swap_start = time.perf_counter()
    await rt.activate(releases[1])
    swap_done = time.perf_counter()
    probe = InferenceCall(scenario="bench", record_id="probe", body=body(PROMPTS[7], 16, stream=True))
    first_token = None
    async for chunk in rt.stream(probe):
        if first_token is None and chunk["choices"][0]["delta"].get("content"):
            first_token = time.perf_counter()
    await asyncio.sleep(2.0)
    stop.set()
    await asyncio.gather(*clients)
    first_new = min((t for t, a in served if a == "bench@r2"), default=float("nan"))
    on_old_after = sum(1 for t, a in served if a == "bench@r1" and t > swap_done)
    print(f"\n3. adapter hot swap under load (6 clients, {len(served)} requests served)")
    print(f"   activate() call -> new requests routed to r2 : {swap_done - swap_start:6.3f} s (target <= 1 s)")
    print(f"   activate() call -> first token from r2 (probe request sent right after, "
          f"adapter {probe.extras['adapter']}): {first_token - swap_start:6.3f} s")
    print(f"   activate() call -> first full response from r2 to a looping client: {first_new - swap_start:6.3f} s")
    print(f"   in-flight requests that finished on r1 after the switch: {on_old_after}")
    print(f"   failed requests: {len(failures)} (target 0)" + (f"  e.g. {failures[0]}" if failures else ""))
    print(f"   adapters resident after drain: {sorted(getattr(rt.engine.model, 'peft_config', {}))}")
    if rss_requests:
        await rss_phase(rt, idle, rss_requests, rss_tokens, rss_warmup, rss_every)
    await rt.aclose()


# ---------------------------------------------------------------------------- 5. agent-sized prompts

LONG_TARGET_MB = {1: 1536, 4: 3072}  # the targets: one prompt, four at once
_UNIT = ("Tool `{i}`: reads a file of the project and returns its lines with numbers; arguments: path "
         "(string, required), offset (integer), limit (integer). Use it before editing code. "
         "def handler_{i}(request, context):\n    return {{'status': 200, 'items': [x * {i} for x in range(8)]}}\n")


def tree_env(tree: Path, token: str) -> dict[str, str]:
    """The environment of a ``reef serve`` that imports Reef and its plugins from ``tree``."""
    paths = [tree, *sorted(tree.glob("reef_recipe_*")), *sorted((tree / "plugins").glob("*"))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in paths if p.is_dir()), "REEF_TOKEN": token,
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def agent_body(tok, model_id: str, tokens: int, max_tokens: int) -> dict:
    """A Claude-Code-like Messages body (a long system prompt of tool documentation and code, a
    short user turn) whose prompt, rendered by the model's chat template, is ``tokens`` tokens."""
    user = "Fix the failing test in handler_7 and explain the change."

    def rendered(system: str) -> int:
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return len(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))

    text = "".join(_UNIT.format(i=i) for i in range(tokens // 20 + 10))
    ids = tok(text, add_special_tokens=False)["input_ids"]
    keep = tokens - (rendered("") - 1)
    for _ in range(8):  # decode/encode round trips shift the count by a few tokens: settle it
        system = tok.decode(ids[:keep])
        miss = tokens - rendered(system)
        if miss == 0:
            break
        keep += miss
    return {"model": model_id, "max_tokens": max_tokens, "temperature": 0, "system": system,
            "messages": [{"role": "user", "content": user}]}


def post_messages(port: int, token: str, body: dict) -> tuple[int, dict]:
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/messages", data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", "x-api-key": token,
                                          "anthropic-version": "2023-06-01"})
    try:
        with urllib.request.urlopen(req, timeout=3600) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def reset_peak(pid: int) -> None:
    """Start a fresh VmHWM for ``pid`` (Linux: writing 5 to clear_refs resets the peak RSS)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def long_case(pid: int, port: int, token: str, body: dict, n: int) -> dict:
    """``n`` copies of ``body`` at once; the server's peak RSS over them, its RSS right after and 3 s later."""
    from concurrent.futures import ThreadPoolExecutor

    time.sleep(1.0)
    reset_peak(pid)
    start = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(lambda _: post_messages(port, token, body), range(n)))
    elapsed = time.perf_counter() - start
    after = status_memory(pid)
    time.sleep(3.0)
    statuses = sorted({status for status, _ in answers})
    first = answers[0][1]
    note = (first.get("error", {}).get("message", "") if answers[0][0] != 200
            else f"{first.get('usage', {}).get('input_tokens')} prompt tokens")
    return {"statuses": statuses, "peak": after["VmHWM"], "after": after["VmRSS"], "idle": status_memory(pid)["VmRSS"],
            "seconds": elapsed, "note": note}


def long_server(tree: Path, model: Path, tmp: Path, name: str, token: str):
    import subprocess

    from proxy_overhead import check_source, free_port, wait_http

    env = tree_env(tree, token)
    check_source(env, tmp, tree)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "from reef_core.cli import main; main()", "serve", "runtime=local",
                             f"runtime.model={model}", "runtime.device=cpu", f"server.port={port}",
                             f"server.state_dir={tmp / name}", "server.log_level=warning"], env=env, cwd=tmp)
    if not wait_http(port, "/readyz", proc, timeout=600):
        proc.kill()
        raise SystemExit(f"reef serve runtime=local from {tree} did not start")
    return proc, port


def long_prompts(model: Path, tree: Path, baseline: Path | None, long_tokens: int, over_tokens: int, concurrent: int,
                 max_tokens: int) -> None:
    import json
    import urllib.request

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
    context = json.loads((model / "config.json").read_text()).get("max_position_embeddings")
    long_tokens = long_tokens or context - max_tokens - 8
    trees = ([("baseline", baseline)] if baseline else []) + [("this tree", tree)]
    token = "sk-reef-bench-" + os.urandom(8).hex()
    cases = [(f"{n} x {t:,} tokens", t, n) for t in (long_tokens, over_tokens) for n in (1, concurrent)]
    results: dict[str, dict[str, dict]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="reef-bench-long-"))
    for name, tree in trees:
        proc, port = long_server(tree, model, tmp, name.replace(" ", "-"), token)
        try:
            with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers={
                    "authorization": f"Bearer {token}"})) as r:
                model_id = json.loads(r.read())["data"][0]["id"]
            idle = status_memory(proc.pid)["VmRSS"]
            print(f"   {name}: {tree}, ready, RSS {mb(idle).strip()}", flush=True)
            for label, tokens, n in cases:
                results.setdefault(label, {})[name] = out = long_case(
                    proc.pid, port, token, agent_body(tok, model_id, tokens, max_tokens), n)
                print(f"   {name:10s} {label:22s} {out}", flush=True)
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"\n5. agent-sized prompts through reef serve runtime=local (/v1/messages, max_tokens {max_tokens}; "
          f"the model's context: {context} tokens)")
    print("   peak = the server's VmHWM over the case; after = its RSS when the last answer came; idle = 3 s later")
    for label, _, n in cases:
        target = f" (target <= {LONG_TARGET_MB[n]} MB)" if n in LONG_TARGET_MB else ""
        print(f"   {label}{target}")
        for name, _ in trees:
            r = results[label][name]
            print(f"     {name:10s} HTTP {'/'.join(map(str, r['statuses']))}  peak {mb(r['peak'])}  after {mb(r['after'])}"
                  f"  idle {mb(r['idle'])}  {r['seconds']:6.1f} s  {r['note'][:110]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rss-requests", type=int, default=0, help="run phase 4 with this many requests (0: skip)")
    parser.add_argument("--rss-only", action="store_true", help="run only phase 4 (on a fresh process)")
    parser.add_argument("--rss-tokens", type=int, default=16, help="max_tokens of each phase-4 request")
    parser.add_argument("--rss-warmup", type=int, default=64, help="phase-4 requests before the plateau is read")
    parser.add_argument("--rss-every", type=int, default=100, help="print RSS every this many phase-4 requests")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--long", action="store_true", help="run only phase 5 (agent-sized prompts, real servers)")
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1],
                        help="phase 5: the source tree whose server is measured (default: this checkout)")
    parser.add_argument("--baseline", type=Path, help="phase 5: also run a server from this source tree, first")
    parser.add_argument("--model", type=Path, help="phase 5: the HF model directory served (default: the embedded "
                        "model's converted copy in the cache)")
    parser.add_argument("--long-tokens", type=int, default=0, help="phase 5: prompt size that fits (0: the context "
                        "less max_tokens and a margin)")
    parser.add_argument("--over-tokens", type=int, default=12_000, help="phase 5: prompt size past the context")
    parser.add_argument("--concurrent", type=int, default=4, help="phase 5: prompts sent at once")
    parser.add_argument("--long-max-tokens", type=int, default=8, help="phase 5: max_tokens of each request")
    args = parser.parse_args()
    if args.long:
        if args.model is None:
            from reef_torch.model_loading import resolve_model_dir

            args.model = resolve_model_dir(None)[0]
        sys.exit(long_prompts(args.model.resolve(), args.tree.resolve(), args.baseline, args.long_tokens, args.over_tokens,
                              args.concurrent, args.long_max_tokens))
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    if args.rss_only and args.rss_requests <= 0:
        parser.error("--rss-only needs --rss-requests N")
    sys.exit(asyncio.run(main(args.tokens, args.rounds, args.rss_requests, args.rss_only, args.rss_tokens,
                              args.rss_warmup, args.rss_every)))
