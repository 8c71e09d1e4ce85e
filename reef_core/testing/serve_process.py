"""A real ``reef serve`` in a child process: ``python -m reef_core serve -c <file>`` on a
loopback port with its own state directory, for the demo, the benches and end-to-end checks.

Unlike ``ReefServer`` (the app in a thread of this process), the child is the server a user
runs: its own interpreter, the installed plugins, the config file composed as the CLI does, a
clean shutdown on SIGINT. ``ServeProcess`` owns its life cycle (``start``, ``wait_ready``,
``stop``, ``log_tail``) and the clients a user holds (``http``, ``openai``); the demo's and
the bench's servers add what their user does on top.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

#: the ``api_key`` the OpenAI client sends to a server without tokens (auth is off, loopback only)
NO_TOKEN = "no-token-needed-on-loopback"


def free_port() -> int:
    """A TCP port free on loopback now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """``python -m reef_core serve -c <workdir>/reef.yaml`` on ``127.0.0.1:port``, state in
    ``<workdir>/state``, output in ``<workdir>/serve.log``; stopped with SIGINT (a clean
    shutdown), killed if it hangs.

    ``config`` is written as the config file; with a ``token`` it gets ``auth.tokens`` holding
    that admin token and the clients send it, without one auth is off (the server binds
    loopback only, ``reef_core.serve.auth``). ``overrides`` follow the file on the command line
    (``runtime=local``, ``recipe=sao`` …). ``env`` adds variables to the child's environment
    unless this process already sets them (a thread split such as ``OMP_NUM_THREADS``,
    ``REEF_SERVERS_DIR``: by default the child's own, so a test's server is not recorded as the
    one of the directory the tests run in); ``cwd`` is the child's working directory;
    ``REEF_URL`` and ``REEF_TOKEN`` are never passed on and the Hugging Face hub is offline.
    ``scenario`` goes as ``x-reef-scenario`` on every request of ``http`` and ``openai``.
    A failed start raises ``error`` with a message that begins with ``label`` and ends with the
    log tail.
    """

    def __init__(self, workdir: Path, config: Mapping[str, Any], overrides: Sequence[str] = (), *,
                 port: int | None = None, token: str | None = None, scenario: str | None = None,
                 env: Mapping[str, str] | None = None, label: str = "the server",
                 error: type[Exception] = RuntimeError, ready_timeout: float = 300.0,
                 http_timeout: float = 300.0, cwd: Path | None = None):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.label = label
        self.error = error
        self.ready_timeout = ready_timeout
        self.env = dict(env or {})
        #: the child's working directory (default: this process's), where the CLI run with no
        #: arguments finds it (``reef_core.served_dirs``)
        self.cwd = cwd
        config = dict(config)
        if token is not None:
            config["auth"] = {"tokens": [{"token": token, "role": "admin", "scenarios": None}]}
        self.config_file = self.dir / "reef.yaml"
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = self.dir / "serve.log"
        self.argv = [sys.executable, "-m", "reef_core", "serve", "-c", str(self.config_file), *overrides,
                     f"server.state_dir={self.dir / 'state'}", "server.host=127.0.0.1", f"server.port={self.port}"]
        self.headers = {**({"authorization": f"Bearer {token}"} if token else {}),
                        **({"x-reef-scenario": scenario} if scenario else {})}
        self.proc: subprocess.Popen | None = None
        self.http = httpx.Client(base_url=self.url, timeout=http_timeout, headers=self.headers)
        #: the model the server names first on ``/v1/models`` (set by ``wait_ready``)
        self.model = ""
        self._openai: Any = None

    def __enter__(self) -> ServeProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the child (it runs on while this returns; ``wait_ready`` waits for it)."""
        env = {k: v for k, v in os.environ.items() if k not in ("REEF_URL", "REEF_TOKEN")}
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        # which directory serves which state is recorded per user: a test's child records it in
        # its own directory unless the test names one (to run the CLI against it)
        env.setdefault("REEF_SERVERS_DIR", str(self.dir / "servers"))
        for name, value in self.env.items():
            env.setdefault(name, value)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd=self.cwd)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until ``/readyz`` answers 200 and ``/v1/models`` names the model; ``error``
        when the child exits first or ``timeout`` (default ``ready_timeout``) runs out."""
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise self.error(f"{self.label} exited during start-up:\n{self.log_tail()}")
            try:
                if self.http.get("/readyz", timeout=2).status_code == 200:
                    self.model = self.http.get("/v1/models").json()["data"][0]["id"]
                    return
            except (httpx.HTTPError, LookupError, ValueError):
                pass
            time.sleep(0.25)
        raise self.error(f"{self.label} was not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` of the server's output."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self) -> None:
        """Block until the server exits."""
        if self.proc is not None:
            self.proc.wait()

    def stop(self) -> None:
        """SIGINT (a clean shutdown: records flushed), a kill after 60 s; the clients close."""
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

    @property
    def openai(self) -> Any:
        """An ``openai.OpenAI`` client of the server (made on first use)."""
        if self._openai is None:
            from openai import OpenAI

            self._openai = OpenAI(base_url=f"{self.url}/v1", api_key=self.token or NO_TOKEN, max_retries=2,
                                  timeout=300, default_headers={k: v for k, v in self.headers.items()
                                                                if k != "authorization"})
        return self._openai
