"""Who judges turns (the PRM): the option ``judge``, a mapping with a ``name`` and its options.

- ``{name: runtime}`` (the default): the scenario's own runtime serving the frozen base model —
  the call names a release without an artifact, which every runtime serves as the plain base
  (no adapter, no harness). Judge calls are not recorded and never train.
- ``{name: openai, url, model, api_key?, timeout_s?}``: any OpenAI-compatible endpoint
  (``url`` up to ``/v1``, e.g. ``http://judge:8000/v1``).
- ``{name: none}``: correlate only: sessions resolve, nothing is judged, nothing trains.
- ``{name: <plugin>, ...options}``: a judge a package registers in the entry-point group
  ``reef_openclaw.judges`` (``my_judge = "my_pkg:MyJudge"``), or in-process with
  ``register_judge``; built as ``cls(**options)``, it subclasses ``Judge``: one method,
  ``generate(messages, temperature=, max_tokens=) -> str``, whose answer ends in
  ``\\boxed{1}``, ``\\boxed{-1}`` or ``\\boxed{0}`` (a classifier can answer just that).
"""

from __future__ import annotations

import importlib.metadata
import uuid
from abc import ABC, abstractmethod
from typing import Any

from reef_core import ConfigError, InferenceCall, base_release

ENTRY_POINT_GROUP = "reef_openclaw.judges"

_registered: dict[str, type] = {}


class Judge(ABC):
    """Answers one judge prompt (chat messages) with text."""

    @abstractmethod
    async def generate(self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int) -> str:
        """One independent sample of the judge's answer to ``messages``."""

    async def aclose(self) -> None:
        """Release connections. Default: nothing to release."""


def answer_text(body: Any) -> str:
    """The text of an OpenAI chat completion body."""
    try:
        content = body["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise ValueError("the judge's answer is not a chat completion") from None
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


class RuntimeJudge(Judge):
    """The scenario's runtime with the frozen base: a call on a release without an artifact."""

    def __init__(self, runtime: Any, scenario: str, model: str | None = None):
        if getattr(runtime, "dialect", "openai") != "openai":
            raise ConfigError("judge 'runtime' needs a runtime that speaks the OpenAI dialect; "
                              "set recipe.judge to {name: openai, url: ..., model: ...}")
        self.runtime = runtime
        self.scenario = scenario
        self.model = model
        self.base = base_release(scenario)

    async def generate(self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int) -> str:
        body: dict[str, Any] = {"messages": messages, "temperature": temperature, "max_tokens": max_tokens}
        if self.model:
            body["model"] = self.model
        call = InferenceCall(scenario=self.scenario, record_id=f"judge_{uuid.uuid4().hex}", body=body,
                             release=self.base)
        return answer_text(await self.runtime.complete(call))


class OpenAIJudge(Judge):
    """Any OpenAI-compatible chat completions endpoint."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout_s: float = 120.0,
                 transport: Any = None):
        import httpx

        if not url or not model:
            raise ConfigError("judge 'openai' needs url (up to /v1) and model")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/") + "/chat/completions"
        self.model = model
        self.client = httpx.AsyncClient(timeout=timeout_s, headers=headers, transport=transport)

    async def generate(self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int) -> str:
        resp = await self.client.post(self.url, json={"model": self.model, "messages": messages,
                                                      "temperature": temperature, "max_tokens": max_tokens})
        resp.raise_for_status()
        return answer_text(resp.json())

    async def aclose(self) -> None:
        await self.client.aclose()


def register_judge(name: str, cls: type) -> None:
    """Make judge ``name`` available in this process (tests, embedding applications)."""
    if name in ("runtime", "openai", "none"):
        raise ValueError(f"judge name {name!r} is built in")
    _registered[name] = cls


def unregister_judge(name: str) -> None:
    _registered.pop(name, None)


def judge_class(name: str) -> type:
    """The class registered as judge ``name`` (in-process first, then the entry points)."""
    if name in _registered:
        return _registered[name]
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                return ep.load()
            except Exception as exc:
                raise ConfigError(f"judge plugin {name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}") \
                    from exc
    known = sorted({*_registered, *(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))})
    raise ConfigError(f"unknown judge {name!r}: use runtime, openai, none"
                      + (f" or an installed judge ({', '.join(known)})" if known else ""))


def judge_spec(spec: Any) -> tuple[str, dict[str, Any]]:
    """``(name, options)`` of the option ``judge`` (None: the runtime judge)."""
    if spec is None:
        return "runtime", {}
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, dict) and isinstance(spec.get("name", "runtime"), str):
        options = dict(spec)
        return options.pop("name", "runtime"), options
    raise ConfigError(f"recipe.judge must be a mapping with a name (runtime, openai, none or a plugin), not {spec!r}")


def check_judge_spec(spec: Any) -> None:
    """Refuse a judge configuration that cannot work (at recipe construction, before serving)."""
    name, options = judge_spec(spec)
    if name == "runtime":
        unknown = set(options) - {"model"}
    elif name == "openai":
        unknown = set(options) - {"url", "model", "api_key", "timeout_s"}
        if not options.get("url") or not options.get("model"):
            raise ConfigError("recipe.judge {name: openai} needs url (up to /v1) and model")
    elif name == "none":
        unknown = set(options)
    else:
        judge_class(name)
        unknown = set()
    if unknown:
        raise ConfigError(f"recipe.judge {name!r} does not take {', '.join(sorted(unknown))}")


def build_judge(spec: Any, *, runtime: Any, scenario: str) -> Judge | None:
    """The judge ``spec`` names, for ``scenario`` (None for ``none``: correlate only)."""
    name, options = judge_spec(spec)
    if name == "none":
        return None
    if name == "runtime":
        return RuntimeJudge(runtime, scenario, **options)
    if name == "openai":
        return OpenAIJudge(**options)
    cls = judge_class(name)
    judge = cls(**options)
    if not callable(getattr(judge, "generate", None)):
        raise ConfigError(f"judge {name!r} has no generate(messages, temperature=, max_tokens=) method")
    return judge
