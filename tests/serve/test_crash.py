"""A ``reef serve`` process killed with SIGKILL keeps every record it acknowledged."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from reef_core.testing import FakeUpstream, parse_sse

N = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(state_dir, upstream_url: str, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "from reef_core.cli import main; main()", "serve",
           f"server.port={port}", f"server.state_dir={state_dir}", f"runtime.upstream_url={upstream_url}",
           "server.log_level=warning"]
    env = {**os.environ, "REEF_PLUGINS": ""}
    env.pop("REEF_TOKEN", None)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _wait_ready(proc: subprocess.Popen, url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"reef serve exited: {proc.stdout.read().decode(errors='replace')}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("reef serve did not become ready")


def _one(url: str, i: int) -> str | None:
    """Send request ``i``; the receipt once acknowledged (a 200 body, or a stream's final marker)."""
    body = {"model": "m", "messages": [{"role": "user", "content": f"request {i}"}]}
    try:
        if i % 2 == 0:
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
            return r.headers["x-reef-agent-record-id"] if r.status_code == 200 else None
        r = httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=30)
        events = parse_sse(r.text)
        marker = [d["reef"] for _, d in events if isinstance(d, dict) and "reef" in d]
        return marker[0]["agent_record_id"] if marker else None
    except httpx.HTTPError:
        return None


def test_sigkill_loses_no_acknowledged_record(tmp_path):
    with FakeUpstream("openai") as up:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = _serve(tmp_path, up.url, port)
        try:
            _wait_ready(proc, url)
            with ThreadPoolExecutor(8) as pool:
                receipts = [r for r in pool.map(lambda i: _one(url, i), range(N)) if r]
            assert len(receipts) == N
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = _serve(tmp_path, up.url, port)
        try:
            _wait_ready(proc, url)
            for receipt in receipts:
                r = httpx.get(f"{url}/reef/records/{receipt}", timeout=10)
                assert r.status_code == 200, receipt
                assert r.json()["status"] == "ok" and r.json()["response"]["choices"]
        finally:
            proc.terminate()
            proc.wait(30)


def test_missing_upstream_url_is_one_clear_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
    env["REEF_PLUGINS"] = ""
    p = subprocess.run([sys.executable, "-c", "from reef_core.cli import main; main()", "serve",
                        f"server.state_dir={tmp_path}", f"server.port={_free_port()}"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "upstream_url" in p.stderr and "Traceback" not in p.stderr
