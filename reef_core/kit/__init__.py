"""The plugin author's kit: shared helpers for runtimes and other plugins, without torch or the server.

Plugins import these from here (``from reef_core.kit import AdapterTable``); the submodules are
where the code lives, not a separate surface. What is in the kit:

- ``AdapterTable``, ``Version``, ``version_name`` — which adapter version each scenario serves
  and when an old one may be unloaded, for runtimes that hot-swap LoRA adapters
  (``reef_core.kit.adapters``).
- ``split_url_credentials``, ``redact_url``, ``basic_auth`` — configured URLs that may carry
  ``user:password@``: credentials out of the URL and into a Basic ``Authorization`` header,
  the host alone in log lines (``reef_core.kit.urls``).
- ``Http1Transport`` — Reef's own pooled HTTP/1.1 client for a runtime's hot path to its model
  server: ``send(method, url, headers, body, timeout)``, the answer whole or as it arrives,
  httpx's exception types (``reef_core.kit.http1``; what the ``upstream`` runtime uses).
- ``AiohttpTransport``, ``aiohttp_available`` — the same ``send`` on aiohttp's connection pool,
  also an ``httpx`` transport (``reef_core.kit.http_transport``; aiohttp is imported only
  when one is built).
- ``BUILTIN_GRADERS``, ``graders_of`` — the task graders (``exact``, ``contains``, ``regex``)
  and the full set with the plugins' own, for a recipe that grades its own episodes the way
  ``task_suite`` does (``reef_core.kit.graders``).
- ``task_body``, ``content_text`` — a held-out task (``evaluator.tasks``) as a request body in the
  runtime's dialect, and the plain text of a message's content, for a recipe that runs the
  scenario's tasks itself and must ask what ``task_suite`` asks (``reef_core.kit.tasks``).
- ``chat_request``, ``chat_reply`` — a recorded request and answer in Chat Completions shape
  whatever route served them (``/v1/chat/completions``, ``/v1/responses``, ``/v1/messages``), for
  a recipe that reads conversations from records (``reef_core.kit.records``).
- ``jsonfast`` — ``dumps`` (to bytes), ``loads``, ``nesting_depth``: orjson when installed,
  the standard library otherwise.
- ``lazy_exports`` — a package ``__getattr__`` that imports each public name on first use, so a
  plugin's entry point loads without its heavy modules (``reef_core.kit.lazy``).

The kernel itself uses the same code (``reef_core.adapter_table``, ``reef_core.serve.jsonfast``
and ``reef_core.serve.http_transport`` re-export it), so there is one copy of each helper.
"""

from __future__ import annotations

from typing import Any

from . import jsonfast
from .adapters import AdapterTable, Version, version_name
from .graders import BUILTIN_GRADERS, graders_of
from .lazy import lazy_exports
from .records import chat_reply, chat_request
from .tasks import content_text, task_body
from .urls import basic_auth, redact_url, split_url_credentials

_LAZY = {"AiohttpTransport": ("http_transport", "AiohttpTransport"),
         "aiohttp_available": ("http_transport", "available"), "Http1Transport": ("http1", "Http1Transport")}


def __getattr__(name: str) -> Any:
    # The transports import httpx: load them only for a runtime that uses one.
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BUILTIN_GRADERS",
    "AdapterTable",
    "AiohttpTransport",
    "Http1Transport",
    "Version",
    "aiohttp_available",
    "basic_auth",
    "chat_reply",
    "chat_request",
    "content_text",
    "graders_of",
    "jsonfast",
    "lazy_exports",
    "redact_url",
    "split_url_credentials",
    "task_body",
    "version_name",
]
