"""Reef under concurrent load in front of an upstream that misbehaves on request.

Each request names a fault (``faults.FAULTS``: error statuses, hangs past ``runtime.timeout_s``,
stalls, cut connections, streams without their final event, answers nested 1,000 levels,
malformed JSON, HTML, empty and huge answers, slow drips); healthy requests are interleaved.
Whatever the upstream does:

- healthy requests are still answered 200 and recorded ``ok``;
- Reef answers each fault as documented (502/504, or the upstream's own status relayed; 200
  with an in-band error event for a stream that broke after it started) and never with a 5xx
  of its own;
- nothing hangs (every answer within the client's bound);
- every answer that carried a receipt has a readable record with the right status, by id and
  in its scenario's pages;
- afterwards ``/healthz`` and ``/readyz`` answer 200 and the record writer is alive.
"""

from __future__ import annotations

from collections import Counter

import pytest
from faults import FAULTS, FaultUpstream, Shot, fire, plan, run_load, summarize, verify_receipts

from reef_core.testing import ReefServer

SCENARIOS = ["faults-a", "faults-b", "faults-c"]


@pytest.fixture(scope="module")
def upstream():
    with FaultUpstream(hang_s=4.0, huge_bytes=1 << 20) as up:
        yield up


def _report(results) -> str:
    lines = []
    for r in [r for r in results if r.problem][:25]:
        lines.append(f"- [{r.problem}] {r.shot.route} stream={r.shot.stream} fault={r.shot.fault}: {r.detail[:400]}")
    return "\n".join(lines)


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_faults_under_concurrent_load(request, upstream, tmp_path, dialect, store):
    shots = plan(7 if dialect == "openai" else 11, 168, scenarios=SCENARIOS)
    assert {s.fault for s in shots} == set(FAULTS)  # every fault is exercised
    before = Counter(upstream.injected)
    # hangs and stalls time out after 2 s of reading; no fault concerns connecting, and on a busy
    # 2-core CI machine a 1 s connect timeout to loopback once failed a healthy request (502), as
    # a 1 s read timeout failed drips and healthy streams with four test workers on 2 cores (the
    # upstream, Reef and the 12 clients share this process)
    overrides = ["runtime.timeout_s=2", "runtime.connect_timeout_s=5"]
    if store == "postgres":
        overrides.append(f"record_store.url={request.getfixturevalue('fresh_pg_url')}")
    with ReefServer(tmp_path, overrides, upstream=upstream.url, dialect=dialect, graceful_s=2,
                    log_level="critical") as reef, reef.client(timeout=10) as client:
        results = run_load(reef.url, shots, concurrency=12, alive=lambda: reef.app.state.serve.writer.alive)
        verify_receipts(client, results)
        problems = summarize(results)
        assert not problems, f"{dict(problems)} in {len(results)} requests:\n{_report(results)}"

        # healthy requests were answered as such in the middle of the faults
        healthy = [r for r in results if r.shot.fault == "ok"]
        assert healthy and all(r.status == 200 and r.record_status == "ok" for r in healthy)
        # the upstream really misbehaved as asked (the fault directive reached it)
        injected = Counter(upstream.injected) - before
        assert set(injected) == set(FAULTS), injected

        # and the server is still fine
        assert client.get("/healthz").status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert reef.app.state.serve.writer.alive
        after = fire(client, Shot(10_000, dialect, False, "ok", "faults-after"))
        assert after.status == 200 and not after.problem, after.detail
        assert not verify_receipts(client, [after])
