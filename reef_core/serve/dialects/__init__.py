"""Translation between the client dialects and the runtime's.

The server speaks whatever dialect the client used and the runtime speaks its own; these
modules translate request bodies client→runtime and responses (whole or streamed)
runtime→client. Translation is lossless for what both dialects can express — messages,
system prompts, images, tool definitions, tool choice, tool calls and results, stop
reasons, usage — and drops what one side cannot express (e.g. Anthropic ``thinking``
blocks for an OpenAI client, ``logit_bias`` for an Anthropic upstream).

Runtimes speak ``openai`` (Chat Completions) or ``anthropic`` (Messages). Clients may also
speak ``responses`` (the OpenAI Responses API), which is carried through Chat Completions
(``responses_api``).
"""

from __future__ import annotations

from typing import Any

from . import requests as _requests
from . import responses as _responses
from . import streams as _streams
from .responses import usage_summary as _usage_summary
from .responses_api import (
    TERMINAL_EVENTS,
    Chained,
    ChatToResponsesStream,
    ResponsesAssembler,
    chat_to_responses,
    responses_to_chat,
)
from .streams import is_usage_chunk

DIALECTS = ("openai", "anthropic")
#: what a client may speak: the runtime dialects, and the Responses API
CLIENT_DIALECTS = (*DIALECTS, "responses")


def translate_request(body: dict[str, Any], source: str, target: str, *,
                      default_max_tokens: int = _requests.DEFAULT_MAX_TOKENS) -> dict[str, Any]:
    """``body`` (in the client's ``source`` dialect) as a ``target`` (runtime) dialect request body."""
    if source == "responses":
        with _requests.client_shape("responses", target, "input, tools, tool_choice and text"):
            body = responses_to_chat(body)
        source = "openai"
    return _requests.translate_request(body, source, target, default_max_tokens=default_max_tokens)


def translate_response(body: dict[str, Any], source: str, target: str, *,
                       request: dict[str, Any] | None = None, response_id: str = "") -> dict[str, Any]:
    """A ``source`` (runtime) response body as the ``target`` (client) dialect's, its ``id``
    being ``response_id`` (the receipt) when given; a Responses client's answer also echoes
    its ``request``."""
    if target == "responses":
        chat = _responses.translate_response(body, source, "openai")
        return chat_to_responses(chat, request or {}, response_id)
    out = _responses.translate_response(body, source, target)
    return {**out, "id": response_id} if response_id and isinstance(out, dict) else out


def stream_translator(source: str, target: str, *, request: dict[str, Any] | None = None,
                      response_id: str = "") -> Any:
    """A translator from ``source`` (runtime) to ``target`` (client) stream events; with a
    ``response_id`` (the receipt) every chunk's ``id`` (Chat Completions) or the message's
    (Anthropic ``message_start``) is that."""
    if target == "responses":
        to_responses = ChatToResponsesStream(request or {}, response_id)
        return to_responses if source == "openai" else Chained(_streams.stream_translator(source, "openai"),
                                                                to_responses)
    translator = _streams.stream_translator(source, target)
    return _streams.WithId(translator, target, response_id) if response_id else translator


def stream_assembler(dialect: str) -> Any:
    """What folds ``dialect`` stream events into the non-streamed body (what records keep)."""
    return ResponsesAssembler() if dialect == "responses" else _streams.StreamAssembler(dialect)


def usage_summary(body: Any, dialect: str) -> dict[str, Any] | None:
    """Usage of a response in one shape for records: input/output/total tokens (+ cached)."""
    if dialect == "responses":
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return None
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
        inp, out = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
        summary: dict[str, Any] = {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out}
        if cached:
            summary["cached_input_tokens"] = cached
        return summary
    return _usage_summary(body, dialect)


StreamAssembler = _streams.StreamAssembler

__all__ = [
    "CLIENT_DIALECTS",
    "DIALECTS",
    "StreamAssembler",
    "TERMINAL_EVENTS",
    "is_usage_chunk",
    "stream_assembler",
    "stream_translator",
    "translate_request",
    "translate_response",
    "usage_summary",
]
