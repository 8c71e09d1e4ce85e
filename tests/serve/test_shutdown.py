"""Shutdown: requests in flight finish or are cancelled, and every record is flushed first."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx

from reef_core.store import RecordStore
from reef_core.testing import FakeUpstream, ReefServer
from reef_core.testing.serve_process import ServeProcess


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


def test_sigterm_cuts_a_generation_that_outlives_the_shutdown_timeout(tmp_path):
    """A real ``reef serve`` with a stream its upstream never finishes: SIGTERM drains for
    ``server.shutdown_timeout_s``, then cuts the stream (the client gets an error event and the
    end of the response, the record says it was cut) and the process exits."""
    config = {"server": {"default_scenario": "default", "log_level": "warning", "shutdown_timeout_s": 1}}
    with FakeUpstream("openai", lambda body: "one two three four five six") as up:
        server = ServeProcess(tmp_path, config, [f"runtime.upstream_url={up.url}", "runtime.model=fake-model"],
                              ready_timeout=120)
        with server:
            up.stall_stream(after_events=2)
            with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=30, json={
                    "model": server.model, "stream": True,
                    "messages": [{"role": "user", "content": "never ends"}]}) as response:
                receipt = response.headers["x-reef-agent-record-id"]
                lines = response.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))  # the generation is running
                server.proc.send_signal(signal.SIGTERM)
                rest = list(lines)  # returns: the server ended the response
            # the 30 s bound is a safety net far above the 1 s timeout, not a measurement
            server.proc.wait(30)
            up.release()
        # uvicorn re-raises the signal once it has shut down cleanly: the exit a SIGTERM'd process reports
        assert server.proc.returncode in (0, -signal.SIGTERM), server.log_tail()
        assert "Traceback" not in server.log_tail(200)
    errors = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert errors and "shut down" in errors[-1]["error"]["message"]
    store = RecordStore(f"sqlite:///{tmp_path / 'state' / 'reef.db'}")
    try:
        record = store.get_record(receipt)
        assert record is not None and record.status == "incomplete"
        assert "cut" in record.error and "server.shutdown_timeout_s" in record.error
    finally:
        store.close()


def test_a_non_streamed_answer_cut_at_shutdown_is_a_503_and_an_incomplete_record(tmp_path):
    with FakeUpstream("openai") as up:
        reef = ReefServer(tmp_path, upstream=up, graceful_s=0.5).start()
        url = reef.settings.record_store_url
        up.hang()
        seen: dict = {}

        def ask() -> None:
            seen["response"] = httpx.post(f"{reef.url}/v1/chat/completions", timeout=10, json={
                "model": "m", "messages": [{"role": "user", "content": "never answered"}]})

        t = threading.Thread(target=ask)
        t.start()
        deadline = time.monotonic() + 10
        while not up.requests and time.monotonic() < deadline:
            time.sleep(0.02)
        reef.stop()
        up.release()
        t.join(10)
    response = seen["response"]
    assert response.status_code == 503
    assert "shut down" in response.json()["error"]["message"]
    store = RecordStore(url)
    try:
        record = store.get_record(response.headers["x-reef-agent-record-id"])
        assert record is not None and record.status == "incomplete" and record.error.startswith("cut:")
    finally:
        store.close()
