"""Run a whole Reef (kernel + app) for tests, on a real loopback socket."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from ..compose import build_reef
from ..config import Settings, TokenSettings, load_settings
from .fake_responses import FakeResponsesUpstream
from .fake_upstream import FakeUpstream
from .servers import ServerThread


def reef_settings(state_dir: str | Path, overrides: Iterable[str] = (), *,
                  upstream: FakeUpstream | FakeResponsesUpstream | str | None = None, dialect: str | None = None,
                  tokens: list[dict[str, Any]] | None = None, config_file: str | Path | None = None) -> Settings:
    """Validated settings for a test Reef: state in ``state_dir``, runtime pointed at ``upstream``.

    ``config_file`` is a YAML file composed under the overrides, as ``reef serve --config`` does.

    ``tokens`` replaces ``auth.tokens`` (e.g. ``[{"token": "t", "role": "infer",
    "scenarios": ["a"]}]``); ``REEF_TOKEN`` from the environment is dropped when given.
    """
    ov = [f"server.state_dir={Path(state_dir)}"]
    if upstream is not None:
        fake = not isinstance(upstream, str)  # a FakeUpstream or FakeResponsesUpstream
        url = upstream.url if fake else str(upstream)
        ov.append(f"runtime.upstream_url={url}")
        dialect = dialect or (upstream.dialect if fake else None)
    if dialect:
        ov.append(f"runtime.dialect={dialect}")
    settings = load_settings([*ov, *overrides], config_file=config_file)
    if tokens is not None:
        settings.auth.tokens = [TokenSettings.model_validate(t) for t in tokens]
    return settings


class ReefServer:
    """A Reef served by uvicorn on ``127.0.0.1:<random port>`` in a thread.

        with FakeUpstream("openai") as up, ReefServer(tmp_path, upstream=up) as reef:
            r = reef.client().post("/v1/chat/completions", json={...})
            record = reef.store.get_record(r.headers["x-reef-agent-record-id"])

    ``overrides`` are Hydra overrides (``server.default_scenario=s``); ``runtime`` replaces the
    configured runtime with an instance (e.g. a scripted one); ``learning=False`` serves without
    a learning loop (releases still serve and follow); ``token`` is sent by
    ``client()`` / ``openai()`` / ``anthropic()`` when given. Leaving the block flushes the
    record writer and stops the kernel, like a server shutdown (requests still running after
    ``graceful_s`` seconds are cancelled first).
    """

    def __init__(self, state_dir: str | Path, overrides: Iterable[str] = (), *,
                 upstream: FakeUpstream | FakeResponsesUpstream | str | None = None, dialect: str | None = None,
                 tokens: list[dict[str, Any]] | None = None, token: str | None = None,
                 settings: Settings | None = None, runtime: Any = None, log_level: str = "warning",
                 graceful_s: float = 5, learning: bool = True):
        from ..plugins import get_plugins
        from ..serve.app import create_app
        from ..serve.edge import uvicorn_options

        self.settings = settings or reef_settings(state_dir, overrides, upstream=upstream, dialect=dialect,
                                                  tokens=tokens)
        self.token = token
        self.reef = build_reef(self.settings, get_plugins(), runtime=runtime, learning=learning)
        self.app = create_app(self.reef)
        self._server = ServerThread(self.app, log_level=log_level, graceful_s=graceful_s,
                                    options=uvicorn_options(self.settings))

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def store(self):
        return self.reef.store

    def start(self) -> ReefServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> ReefServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def wait_record(self, receipt: str, timeout: float = 10.0):
        """The stored record of ``receipt``, waiting up to ``timeout`` seconds for it: a stream's
        record is written as the stream ends, which may be just after the client read its end."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.store.get_record(receipt)
            if record is not None:
                return record
            if time.monotonic() > deadline:
                raise AssertionError(f"record {receipt} was never stored")
            time.sleep(0.02)

    def _auth(self, token: str | None) -> dict[str, str]:
        token = token if token is not None else self.token
        return {"authorization": f"Bearer {token}"} if token else {}

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        """An ``httpx.Client`` for this server (sends the token when one is set)."""
        headers = {**self._auth(token), **kwargs.pop("headers", {})}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kwargs.pop("timeout", 30), **kwargs)

    def openai(self, token: str | None = None, **kwargs: Any):
        """An official ``openai.OpenAI`` client pointed at this server."""
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=token or self.token or "unused",
                             max_retries=0, **kwargs)

    def anthropic(self, token: str | None = None, **kwargs: Any):
        """An official ``anthropic.Anthropic`` client pointed at this server (token as Bearer)."""
        import anthropic

        tok = token or self.token
        return anthropic.Anthropic(base_url=self.url, api_key="unused", max_retries=0,
                                   default_headers=self._auth(tok) if tok else None, **kwargs)
