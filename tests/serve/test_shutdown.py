"""Shutdown: requests in flight finish or are cancelled, and every record is flushed first."""

from __future__ import annotations

import threading
import time

import httpx

from reef_core.store import RecordStore
from reef_core.testing import FakeUpstream, ReefServer


def test_shutdown_flushes_records_of_cancelled_streams(tmp_path):
    with FakeUpstream("openai") as up:
        reef = ReefServer(tmp_path, upstream=up, graceful_s=0.5).start()
        url = reef.settings.record_store_url
        done = reef.client().post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "first"}]})
        up.stall_stream(after_events=2)
        seen: dict = {}

        def stream() -> None:
            try:
                with httpx.stream("POST", f"{reef.url}/v1/chat/completions", timeout=10, json={
                        "model": "m", "stream": True, "messages": [{"role": "user", "content": "second"}]}) as r:
                    seen["receipt"] = r.headers["x-reef-agent-record-id"]
                    for _ in r.iter_bytes():
                        pass
            except httpx.HTTPError:
                pass

        t = threading.Thread(target=stream)
        t.start()
        deadline = time.monotonic() + 10
        while "receipt" not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        reef.stop()  # the stalled stream is cancelled after the grace period
        up.release()
        t.join(10)
    store = RecordStore(url)
    try:
        assert store.get_record(done.headers["x-reef-agent-record-id"]).status == "ok"
        rec = store.get_record(seen["receipt"])
        assert rec is not None and rec.status == "incomplete"
    finally:
        store.close()
