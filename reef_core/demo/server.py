"""The demo's server: a real ``reef serve`` in a child process, and the HTTP calls a user makes.

The demo talks to Reef only as a client would: the official ``openai`` SDK for answers (the
receipt from the response headers), ``POST /reef/report`` for feedback, and the learning
routes (``/reef/scenarios/{s}``, ``.../candidates``, ``.../releases``) to watch the loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..testing.serve_process import ServeProcess, free_port

SCENARIO = "demo"

__all__ = ["SCENARIO", "DemoServer", "ServerError", "free_port"]


class ServerError(RuntimeError):
    """The server did not start, or stopped answering; the message ends with its log tail."""


class DemoServer(ServeProcess):
    """The demo's ``reef serve`` (``reef_core.testing.serve_process``) on a loopback ``port``
    with its own state directory. No token is configured, so auth is off and the server binds
    loopback only (``reef_core.serve.auth``): the dashboard opens without one."""

    def __init__(self, workdir: Path, config: dict[str, Any], overrides: list[str], *, port: int):
        super().__init__(workdir, config, overrides, port=port, scenario=SCENARIO, error=ServerError,
                         label="the server", http_timeout=300.0)

    # ---------------------------------------------------------------- what a user does

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
