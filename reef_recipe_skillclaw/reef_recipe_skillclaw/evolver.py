"""The evolver: the model every step of a night asks, behind one interface.

``evolver: runtime`` (the default) asks the scenario's own runtime through ``ctx.complete`` with
no harness applied; ``{url, model, api_key}`` asks any OpenAI-compatible endpoint over httpx. An
object with ``chat(messages, temperature=, max_tokens=) -> str`` given in-process (a test double,
an embedding application) is used as is. Every call is retried with capped exponential backoff
(tenacity); what still fails is the night's to degrade (a skipped step), never a crash.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import httpx
from tenacity import RetryError, Retrying, stop_after_attempt, wait_exponential

from reef_core.kit import content_text

log = logging.getLogger("reef.recipe.skillclaw")

Messages = list[dict[str, Any]]
_ENDPOINT_KEYS = {"url", "model", "api_key", "timeout_s"}


@runtime_checkable
class Evolver(Protocol):
    """A chat model: the text of its reply to ``messages``."""

    def chat(self, messages: Messages, *, temperature: float, max_tokens: int) -> str: ...


class EvolverError(RuntimeError):
    """The evolver gave no reply after its retries."""


def check_evolver(spec: Any) -> None:
    """ValueError (a config error naming ``recipe.evolver``) unless ``spec`` is usable."""
    if spec == "runtime" or isinstance(spec, Evolver):
        return
    if isinstance(spec, Mapping):
        if not spec.get("url") or not spec.get("model"):
            raise ValueError("evolver needs 'url' (an OpenAI-compatible endpoint) and 'model', or the string 'runtime'")
        unknown = set(spec) - _ENDPOINT_KEYS
        if unknown:
            raise ValueError(f"evolver takes url, model, api_key and timeout_s, not {', '.join(sorted(unknown))}")
        return
    raise ValueError("evolver must be 'runtime' or {url, model, api_key}")


def response_text(body: Any) -> str:
    """The reply text of an OpenAI chat completion or an Anthropic message."""
    if not isinstance(body, dict):
        return ""
    choices = body.get("choices")
    if isinstance(choices, list) and choices:
        return content_text((choices[0] or {}).get("message", {}).get("content"))
    return content_text(body.get("content"))


class RuntimeEvolver:
    """The scenario's runtime (``ctx.complete``, no harness), in the runtime's dialect."""

    def __init__(self, ctx: Any, *, timeout_s: float):
        self.ctx = ctx
        self.timeout_s = timeout_s
        runtime = getattr(ctx, "runtime", None)
        self.dialect = getattr(runtime, "dialect", "openai")
        configured = (getattr(ctx.settings, "runtime", None) or {}).get("model") if ctx.settings is not None else None
        models = runtime.models() if runtime is not None else []
        self.model = configured or (models[0] if models else "default")

    def chat(self, messages: Messages, *, temperature: float, max_tokens: int) -> str:
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "temperature": temperature}
        if self.dialect == "anthropic":
            system = "\n\n".join(str(m["content"]) for m in messages if m["role"] == "system")
            body["messages"] = [m for m in messages if m["role"] != "system"]
            if system:
                body["system"] = system
        else:
            body["messages"] = list(messages)
        return response_text(self.ctx.complete(body, None, timeout_s=self.timeout_s))


class EndpointEvolver:
    """Any OpenAI-compatible ``/v1/chat/completions`` endpoint."""

    def __init__(self, url: str, model: str, api_key: str | None = None, *, timeout_s: float = 120.0):
        base = str(url).rstrip("/")
        if base.endswith("/chat/completions"):
            base = base[: -len("/chat/completions")]
        if not base.endswith("/v1"):
            base += "/v1"
        self.url = base + "/chat/completions"
        self.model = model
        headers = {"authorization": f"Bearer {api_key}"} if api_key and api_key != "none" else {}
        self.http = httpx.Client(timeout=timeout_s, headers=headers)

    def chat(self, messages: Messages, *, temperature: float, max_tokens: int) -> str:
        r = self.http.post(self.url, json={"model": self.model, "messages": messages, "temperature": temperature,
                                           "max_tokens": max_tokens})
        r.raise_for_status()
        return response_text(r.json())

    def close(self) -> None:
        self.http.close()


class RetryingEvolver:
    """``inner`` with ``attempts`` tries, waiting ``base_s``·2ⁿ (at most ``cap_s``) between them;
    ``EvolverError`` when every try failed. Counts calls and failures for the night's metadata."""

    def __init__(self, inner: Evolver, *, attempts: int = 6, base_s: float = 1.0, cap_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep):
        self.inner = inner
        self.attempts = attempts
        self.wait = wait_exponential(multiplier=base_s, min=base_s, max=cap_s)
        self.sleep = sleep
        self.calls = 0
        self.failures = 0

    def chat(self, messages: Messages, *, temperature: float, max_tokens: int) -> str:
        self.calls += 1
        retrying = Retrying(stop=stop_after_attempt(self.attempts), wait=self.wait, sleep=self.sleep,
                            before_sleep=lambda state: log.warning(
                                "skillclaw: evolver call failed (%s); try %d of %d",
                                state.outcome.exception() if state.outcome else "?", state.attempt_number + 1,
                                self.attempts))
        try:
            return retrying(self.inner.chat, messages, temperature=temperature, max_tokens=max_tokens)
        except RetryError as exc:
            self.failures += 1
            cause = exc.last_attempt.exception()
            raise EvolverError(f"the evolver failed {self.attempts} times: {cause}") from cause


def build_evolver(spec: Any, ctx: Any, *, timeout_s: float) -> Evolver:
    """``spec`` (``runtime``, ``{url, model, api_key}``, or an ``Evolver``) as an ``Evolver``."""
    if spec == "runtime":
        return RuntimeEvolver(ctx, timeout_s=timeout_s)
    if isinstance(spec, Mapping):
        return EndpointEvolver(spec["url"], spec["model"], spec.get("api_key"),
                               timeout_s=float(spec.get("timeout_s") or timeout_s))
    return spec


# ------------------------------------------------------------------ replies

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)


def parse_json(text: str) -> dict[str, Any] | None:
    """The JSON object a reply holds: the whole reply, a fenced block, or the first object found
    in the text; None when there is none."""
    text = (text or "").strip()
    candidates = [text, *(m.group(1).strip() for m in _FENCE.finditer(text))]
    for c in candidates:
        try:
            value = json.loads(c)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text[m.start():])
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
