"""Translation between the client dialects and the runtime's.

The server speaks whatever dialect the client used and the runtime speaks its own; these
modules translate request bodies client→runtime and responses (whole or streamed)
runtime→client. Translation is lossless for what both dialects can express — messages,
system prompts, images, tool definitions, tool choice, tool calls and results, stop
reasons, usage — and drops what one side cannot express (e.g. Anthropic ``thinking``
blocks for an OpenAI client, ``logit_bias`` for an Anthropic upstream).

Runtimes speak ``openai`` (Chat Completions), ``anthropic`` (Messages) or ``responses`` (the
OpenAI Responses API). Clients speak the same three. A Responses client in front of a chat
runtime is carried through Chat Completions (``responses_api``); in front of a Responses runtime
its body and answer go through as they are (``native``), and Chat Completions and Anthropic
clients are translated to it through Chat Completions (``responses_upstream``).
"""

from __future__ import annotations

from typing import Any

from ...errors import RuntimeCallError
from ..errors import ClientError
from . import requests as _requests
from . import responses as _responses
from . import streams as _streams
from .responses import usage_summary
from .responses_api import (
    TERMINAL_EVENTS,
    Chained,
    ChatToResponsesStream,
    ResponsesAssembler,
    chat_to_responses,
    responses_to_chat,
)
from .responses_upstream import ResponsesToChatStream, chat_to_responses_request, responses_to_chat_response
from .streams import is_usage_chunk

#: what a runtime may speak
DIALECTS = ("openai", "anthropic", "responses")
#: what a client may speak: the same three
CLIENT_DIALECTS = DIALECTS


def translate_request(body: dict[str, Any], source: str, target: str, *,
                      default_max_tokens: int = _requests.DEFAULT_MAX_TOKENS) -> dict[str, Any]:
    """``body`` (in the client's ``source`` dialect) as a ``target`` (runtime) dialect request body."""
    if source == target:
        return body  # a Responses body before a Responses upstream goes as it came
    if source == "responses":
        with _requests.client_shape("responses", target, "input, tools, tool_choice and text"):
            body = responses_to_chat(body)
        source = "openai"
    if target == "responses":
        _no_responses_counterpart(body, source)
        chat = _requests.translate_request(body, source, "openai", default_max_tokens=default_max_tokens)
        with _requests.client_shape(source, target):
            return chat_to_responses_request(chat)
    return _requests.translate_request(body, source, target, default_max_tokens=default_max_tokens)


def _no_responses_counterpart(body: dict[str, Any], source: str) -> None:
    """A 400 naming a field of a chat client's body that the Responses API cannot express and
    that would change the answer: stop sequences (the text would run past them) and ``n > 1``
    (the client would read choices that never come)."""
    stop = body.get("stop") if source == "openai" else body.get("stop_sequences")
    if stop:
        key = "stop" if source == "openai" else "stop_sequences"
        raise ClientError(f"{key}: the upstream speaks the Responses API, which has no stop sequences; leave "
                          f"{key} out", param=key)
    n = body.get("n") if source == "openai" else None
    if isinstance(n, int | float) and not isinstance(n, bool) and n > 1:
        raise ClientError("n > 1 is not supported when the upstream speaks the Responses API", param="n")


def translate_response(body: dict[str, Any], source: str, target: str, *,
                       request: dict[str, Any] | None = None, response_id: str = "") -> dict[str, Any]:
    """A ``source`` (runtime) response body as the ``target`` (client) dialect's, its ``id``
    being ``response_id`` (the receipt) when given; a Responses client's answer also echoes
    its ``request``."""
    if source == target == "responses":
        return body  # the upstream's own answer, its ids included (previous_response_id follows them)
    if source == "responses":
        body, source = _runtime_shape(responses_to_chat_response, body), "openai"
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
    if source == target == "responses":
        return _streams.Passthrough()  # events as the upstream sent them; Reef adds its receipt at the end
    if target == "responses":
        to_responses = ChatToResponsesStream(request or {}, response_id)
        return to_responses if source == "openai" else Chained(_streams.stream_translator(source, "openai"),
                                                                to_responses)
    if source == "responses":
        to_chat = ResponsesToChatStream()
        translator: Any = to_chat if target == "openai" else Chained(to_chat, _streams.stream_translator("openai",
                                                                                                        target))
    else:
        translator = _streams.stream_translator(source, target)
    return _streams.WithId(translator, target, response_id) if response_id else translator


def _runtime_shape(translate: Any, body: dict[str, Any]) -> dict[str, Any]:
    """``translate(body)`` of an upstream answer; one that is not of the upstream's shape is a 502."""
    try:
        return translate(body)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        raise RuntimeCallError(f"the upstream answered a body that is not a responses response "
                               f"({type(exc).__name__}: {exc})", status=502) from None


def stream_assembler(dialect: str) -> Any:
    """What folds ``dialect`` stream events into the non-streamed body (what records keep)."""
    return ResponsesAssembler() if dialect == "responses" else _streams.StreamAssembler(dialect)


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
