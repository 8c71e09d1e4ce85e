"""Benchmark of the local runtime (reef-torch) on the embedded SmolLM2-135M-Instruct.

Not a test: it prints numbers, in one run, against these targets:

1. generation tokens/s through ``LocalRuntime.complete`` vs raw ``model.generate`` on the
   same model object in the same process (target ≥ 0.9×);
2. throughput with 8 concurrent requests vs the same 8 sent one after another (target ≥ 2×);
3. publish-to-serving latency of an adapter hot swap under continuous load (target ≤ 1 s),
   and the number of failed requests during it (target 0);
4. (with ``--rss-requests N``) resident memory over N short requests at concurrency 8: RSS
   idle, after a warm-up (the plateau), every ``--rss-every`` requests and at the end, the
   final/plateau ratio (target ≤ 1.3×) and the process's peak (VmHWM).

Usage:  HF_HUB_OFFLINE=1 python bench/local_runtime.py [--tokens 64] [--rounds 3]
        HF_HUB_OFFLINE=1 python bench/local_runtime.py --rss-requests 1000 --rss-only
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
    args = parser.parse_args()
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    if args.rss_only and args.rss_requests <= 0:
        parser.error("--rss-only needs --rss-requests N")
    sys.exit(asyncio.run(main(args.tokens, args.rounds, args.rss_requests, args.rss_only, args.rss_tokens,
                              args.rss_warmup, args.rss_every)))
