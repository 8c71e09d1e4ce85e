"""The demo's server: a real ``reef serve`` in a child process, and the HTTP calls a user makes.

The demo talks to Reef only as a client would: the official ``openai`` SDK for answers (the
receipt from the response headers), ``POST /reef/report`` for feedback, and the learning
routes (``/reef/scenarios/{s}``, ``.../candidates``, ``.../releases``) to watch the loop.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

SCENARIO = "demo"


class ServerError(RuntimeError):
    """The server did not start, or stopped answering; the message ends with its log tail."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DemoServer:
    """``python -m reef_core serve -c <workdir>/reef.yaml`` on a loopback ``port`` with its own
    state directory; stopped with SIGINT (a clean shutdown), killed if it hangs. No token is
    configured, so auth is off and the server binds loopback only (``reef_core.serve.auth``):
    the dashboard opens without one."""

    def __init__(self, workdir: Path, config: dict[str, Any], overrides: list[str], *, port: int):
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.config_file = self.dir / "reef.yaml"
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = self.dir / "serve.log"
        self.argv = [sys.executable, "-m", "reef_core", "serve", "-c", str(self.config_file), *overrides,
                     f"server.state_dir={self.dir / 'state'}", "server.host=127.0.0.1", f"server.port={port}"]
        self.proc: subprocess.Popen | None = None
        self.http = httpx.Client(base_url=self.url, timeout=300,
                                 headers={"x-reef-scenario": SCENARIO})
        self.model = ""
        self._openai: Any = None

    # ---------------------------------------------------------------- life cycle

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("REEF_URL", "REEF_TOKEN")}
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise ServerError(f"the server exited during start-up:\n{self.log_tail()}")
            try:
                if self.http.get("/readyz", timeout=2).status_code == 200:
                    self.model = self.http.get("/v1/models").json()["data"][0]["id"]
                    return
            except (httpx.HTTPError, LookupError, ValueError):
                pass
            time.sleep(0.25)
        raise ServerError(f"the server was not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self) -> None:
        """Block until the server exits (``--keep-serving``); Ctrl-C stops it."""
        if self.proc is not None:
            self.proc.wait()

    def stop(self) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.http.close()
        if self._openai is not None:
            self._openai.close()

    # ---------------------------------------------------------------- what a user does

    @property
    def openai(self) -> Any:
        if self._openai is None:
            from openai import OpenAI

            self._openai = OpenAI(base_url=f"{self.url}/v1", api_key="no-token-needed-on-loopback", max_retries=2, timeout=300,
                                  default_headers={"x-reef-scenario": SCENARIO})
        return self._openai

    def ask(self, prompt: str, *, max_tokens: int, tag: str) -> tuple[str, str, str | None]:
        """(receipt, answer, the release that answered: None for the base) of one greedy question."""
        raw = self.openai.chat.completions.with_raw_response.create(
            model=self.model, messages=[{"role": "user", "content": prompt}], temperature=0.0,
            max_tokens=max_tokens, extra_headers={"x-reef-tag-demo": tag})
        return (raw.headers["x-reef-agent-record-id"], raw.parse().choices[0].message.content or "",
                raw.headers.get("x-reef-release-id") or None)

    def report(self, receipt: str, score: float, feedback: str | None, user: str) -> None:
        body: dict[str, Any] = {"references": [receipt], "score": score, "metadata": {"user": user}}
        if feedback:
            body["feedback"] = feedback
        self.http.post("/reef/report", json=body).raise_for_status()

    # ---------------------------------------------------------------- what the loop did

    def loop_state(self) -> dict[str, Any]:
        return self.http.get(f"/reef/scenarios/{SCENARIO}").json().get("loop") or {}

    def candidates(self) -> list[dict[str, Any]]:
        return self.http.get(f"/reef/scenarios/{SCENARIO}/candidates", params={"limit": 1000}).json()["candidates"]

    def releases(self) -> dict[str, Any]:
        return self.http.get(f"/reef/scenarios/{SCENARIO}/releases").json()

    def settled(self) -> bool:
        """No growth step runs and fewer reports are eligible than the recipe's batch."""
        loop = self.loop_state()
        return loop.get("state", "idle") == "idle" and loop.get("eligible", 0) < loop.get("batch_size", 1)
