"""Test helpers for Reef and its plugins: fake model servers and a live Reef.

- ``FakeUpstream(dialect, responder)`` — an OpenAI- or Anthropic-speaking model server on a
  random loopback port; answers come from ``responder(body) -> Reply | str``; controls to
  fail, hang, or cut a stream (see ``reef_core.testing.fake_upstream``).
- ``FakeResponsesUpstream(responder)`` — an OpenAI Responses server (``runtime.dialect:
  responses``): reasoning items, custom and hosted tool calls, streamed events, stored
  responses; output items built with ``responses_items`` (``reef_core.testing.fake_responses``).
- ``Reply`` / ``ToolCall`` — what the fake model says; ``system_prompt``, ``last_user_text``,
  ``tool_results``, ``tool_names`` read a request body of either dialect.
- ``ReefServer(state_dir, overrides, upstream=..., tokens=[...], runtime=..., settings=...)`` —
  kernel + app under uvicorn in a thread, with ``.url``, ``.store``, ``.reef`` (the kernel),
  ``.client()``, ``.openai()``, ``.anthropic()``; leaving it flushes records like a shutdown.
- ``reef_settings(...)`` — validated settings for a test Reef without starting it.
- ``registered(kind, name, obj)`` — a plugin object registered in this process for a block, in
  place of its entry point; ``build_configured(kind, overrides)`` — the object the kernel builds
  for ``kind`` from a composed configuration.
- ``ServerThread(app)`` — any ASGI app on a random port in a thread.
- ``parse_sse(text)`` — events of a raw SSE body.
- contract kits (``reef_core.testing.kits``): ``check_recipe``, ``check_evaluator``,
  ``check_record_filter``, ``check_artifact_store``, ``check_harness_adapter``, ``check_grader``,
  ``check_runtime``, ``check_trainable_base`` — one call checks a plugin object against its
  contract (or a runtime against the ``TrainableBase`` capability); ``synthetic_batch``,
  ``synthetic_release``, ``recipe_context``, ``eval_context``, ``EchoRuntime``
  (``TrainableEchoRuntime``: with ``TrainableBase`` on a local model directory, for weight
  recipes) build their inputs.
- ``reef_core.testing.pytest_plugin`` — ``fake_upstream`` and ``reef_server`` factory fixtures
  (loaded automatically through reef-core's ``pytest11`` entry point).
"""

from . import responses_items
from .fake_responses import FakeResponsesUpstream
from .fake_upstream import FakeUpstream
from .kits import (
    EchoRuntime,
    TrainableEchoRuntime,
    check_artifact_store,
    check_evaluator,
    check_grader,
    check_harness_adapter,
    check_recipe,
    check_record_filter,
    check_runtime,
    check_trainable_base,
    eval_context,
    recipe_context,
    synthetic_batch,
    synthetic_release,
)
from .plugins import build_configured, registered
from .reef_server import ReefServer, reef_settings
from .replies import Reply, Responder, ToolCall, echo, last_user_text, system_prompt, tool_names, tool_results
from .servers import ServerThread
from .sse import parse_sse

__all__ = [
    "EchoRuntime",
    "TrainableEchoRuntime",
    "FakeResponsesUpstream",
    "FakeUpstream",
    "ReefServer",
    "Reply",
    "Responder",
    "ServerThread",
    "ToolCall",
    "build_configured",
    "check_artifact_store",
    "check_evaluator",
    "check_grader",
    "check_harness_adapter",
    "check_recipe",
    "check_record_filter",
    "check_runtime",
    "check_trainable_base",
    "echo",
    "eval_context",
    "last_user_text",
    "parse_sse",
    "recipe_context",
    "reef_settings",
    "registered",
    "responses_items",
    "synthetic_batch",
    "synthetic_release",
    "system_prompt",
    "tool_names",
    "tool_results",
]
