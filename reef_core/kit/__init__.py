"""The plugin author's kit: shared helpers for runtimes and other plugins, without torch or the server.

Plugins import these from here (``from reef_core.kit import AdapterTable``); the submodules are
where the code lives, not a separate surface. What is in the kit:

- ``AdapterTable``, ``Version``, ``version_name`` — which adapter version each scenario serves
  and when an old one may be unloaded, for runtimes that hot-swap LoRA adapters
  (``reef_core.kit.adapters``).
- ``split_url_credentials``, ``redact_url``, ``basic_auth`` — configured URLs that may carry
  ``user:password@``: credentials out of the URL and into a Basic ``Authorization`` header,
  the host alone in log lines (``reef_core.kit.urls``).
- ``AiohttpTransport``, ``aiohttp_available`` — an ``httpx`` transport on aiohttp's connection
  pool, for a runtime's hot path to its model server (``reef_core.kit.http_transport``;
  imported on first use, so the kit does not import aiohttp until asked).
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

The kernel itself uses the same code (``reef_core.adapter_table``, ``reef_core.serve.jsonfast``
and ``reef_core.serve.http_transport`` re-export it), so there is one copy of each helper.
"""

from __future__ import annotations

from typing import Any

from . import jsonfast
from .adapters import AdapterTable, Version, version_name
from .graders import BUILTIN_GRADERS, graders_of
from .records import chat_reply, chat_request
from .tasks import content_text, task_body
from .urls import basic_auth, redact_url, split_url_credentials

_LAZY = {"AiohttpTransport": "AiohttpTransport", "aiohttp_available": "available"}


def __getattr__(name: str) -> Any:
    # The transport module imports aiohttp: load it only for a runtime that uses it.
    if name in _LAZY:
        from . import http_transport

        return getattr(http_transport, _LAZY[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BUILTIN_GRADERS",
    "AdapterTable",
    "AiohttpTransport",
    "Version",
    "aiohttp_available",
    "basic_auth",
    "chat_reply",
    "chat_request",
    "content_text",
    "graders_of",
    "jsonfast",
    "redact_url",
    "split_url_credentials",
    "task_body",
    "version_name",
]
