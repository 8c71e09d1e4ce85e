"""Non-streamed response bodies: Anthropic Messages ⇄ OpenAI Chat Completions, and usage."""

from __future__ import annotations

import time
from typing import Any

from ...errors import RuntimeCallError
from .requests import _dump_arguments, _parse_arguments

#: Anthropic stop_reason -> OpenAI finish_reason
FINISH_FROM_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "pause_turn": "stop",
    "refusal": "content_filter",
}
#: OpenAI finish_reason -> Anthropic stop_reason
STOP_FROM_FINISH = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def translate_response(body: dict[str, Any], source: str, target: str) -> dict[str, Any]:
    """A ``source`` dialect response body as the ``target`` dialect's."""
    if source == target:
        return body
    if (source, target) not in (("openai", "anthropic"), ("anthropic", "openai")):
        raise ValueError(f"cannot translate responses from {source!r} to {target!r}")
    try:
        if source == "anthropic":
            return anthropic_to_openai_response(body)
        return openai_to_anthropic_response(body)
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        raise RuntimeCallError(f"the upstream answered a body that is not a {source} response "
                               f"({type(exc).__name__}: {exc})", status=502) from None


def openai_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Anthropic usage as OpenAI usage (cache reads/writes count as prompt tokens)."""
    if not usage:
        return None
    prompt = (usage.get("input_tokens") or 0) + (usage.get("cache_read_input_tokens") or 0) \
        + (usage.get("cache_creation_input_tokens") or 0)
    completion = usage.get("output_tokens") or 0
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion}
    if usage.get("cache_read_input_tokens"):
        out["prompt_tokens_details"] = {"cached_tokens": usage["cache_read_input_tokens"]}
    return out


def anthropic_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    """OpenAI usage as Anthropic usage."""
    usage = usage or {}
    out: dict[str, Any] = {"input_tokens": usage.get("prompt_tokens") or 0,
                           "output_tokens": usage.get("completion_tokens") or 0}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached:
        out["input_tokens"] -= cached
        out["cache_read_input_tokens"] = cached
    return out


def tokens(value: Any) -> int:
    """A token count as an upstream reported it, or 0 for what is no count (absent, a string,
    a boolean, negative, not finite): a record's usage is built from whatever the upstream sent
    and must not fail on it (the whole record would be lost)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 or value == float("inf"):
        return 0
    return int(value)


def _field(usage: dict[str, Any], key: str, sub: str) -> Any:
    part = usage.get(key)
    return part.get(sub) if isinstance(part, dict) else None


def usage_summary(body: Any, dialect: str) -> dict[str, Any] | None:
    """Usage of a response in one shape for records: input/output/total tokens (+ cached).
    ``dialect``: ``openai`` (``prompt_tokens`` …, cached in ``prompt_tokens_details``),
    ``responses`` (``input_tokens`` …, cached in ``input_tokens_details``) or ``anthropic``
    (cache reads and writes count as input). Counts that are no count are taken as 0."""
    if not isinstance(body, dict):
        return None
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    if dialect == "openai":
        inp, out = tokens(usage.get("prompt_tokens")), tokens(usage.get("completion_tokens"))
        cached = tokens(_field(usage, "prompt_tokens_details", "cached_tokens"))
    elif dialect == "responses":
        inp, out = tokens(usage.get("input_tokens")), tokens(usage.get("output_tokens"))
        cached = tokens(_field(usage, "input_tokens_details", "cached_tokens"))
    else:
        cached = tokens(usage.get("cache_read_input_tokens"))
        inp = tokens(usage.get("input_tokens")) + cached + tokens(usage.get("cache_creation_input_tokens"))
        out = tokens(usage.get("output_tokens"))
    summary: dict[str, Any] = {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out}
    if cached:
        summary["cached_input_tokens"] = cached
    return summary


def anthropic_to_openai_response(body: dict[str, Any]) -> dict[str, Any]:
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for block in body.get("content") or []:
        kind = block.get("type")
        if kind == "text":
            texts.append(block.get("text", ""))
        elif kind == "tool_use":
            tool_calls.append({"id": block.get("id", ""), "type": "function",
                               "function": {"name": block.get("name", ""),
                                            "arguments": _dump_arguments(block.get("input"))}})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    out: dict[str, Any] = {
        "id": body.get("id") or "chatcmpl-reef",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": FINISH_FROM_STOP.get(body.get("stop_reason") or "end_turn", "stop"),
        }],
    }
    usage = openai_usage(body.get("usage"))
    if usage:
        out["usage"] = usage
    return out


def stop_reason(finish_reason: str | None, called_tools: bool) -> str:
    """The Anthropic ``stop_reason`` of an OpenAI ``finish_reason``. An answer that called tools
    stopped for them whatever its finish reason says: some OpenAI-compatible upstreams (Gemini's)
    end one with ``stop``, and an Anthropic agent loop runs the tools only on ``tool_use``."""
    stop = STOP_FROM_FINISH.get(finish_reason or "stop", "end_turn")
    return "tool_use" if called_tools and stop == "end_turn" else stop


def openai_to_anthropic_response(body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices") or [{}]
    choice = choices[0] or {}
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, list):
        text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
    if text:
        content.append({"type": "text", "text": text})
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") or {}
        try:
            args = _parse_arguments(fn.get("arguments"))
        except Exception:
            args = {"arguments": fn.get("arguments")}
        content.append({"type": "tool_use", "id": tc.get("id", ""), "name": fn.get("name", ""), "input": args})
    msg_id = body.get("id") or "msg_reef"
    return {
        "id": msg_id if msg_id.startswith("msg_") else f"msg_{msg_id}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", ""),
        "content": content,
        "stop_reason": stop_reason(choice.get("finish_reason"), any(b["type"] == "tool_use" for b in content)),
        "stop_sequence": None,
        "usage": anthropic_usage(body.get("usage")),
    }
