"""OpenAI chat-completions wire format: validate a request, shape responses and chunks.

Only what the local runtime can honour is accepted; a parameter it cannot honour with a
value that would change the answer (``n > 1``, penalties, ``logit_bias``, ``top_logprobs``,
a JSON ``response_format``, a ``tool_choice`` that forces a call) is refused with a 400 in
OpenAI's error shape rather than silently ignored. Besides OpenAI's own sampling fields it
takes ``top_k`` and ``min_p`` as SGLang and vLLM do (``-1`` or ``0`` turns either off), so a
client written for those servers samples the same way here. Fields that do not change
generation (``user``, ``metadata``, ``tools`` …) are accepted: tools are passed to the chat
template, which renders them when it knows how; tool calls are not parsed.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from reef_core import RuntimeCallError

ROLES = {"system", "developer", "user", "assistant", "tool"}


def invalid(message: str, param: str | None = None) -> RuntimeCallError:
    """A 400 in OpenAI's error shape."""
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}}
    return RuntimeCallError(message, status=400, body=body)


def prompt_too_long(tokens: int, limit: int, model: str, configured: bool = False) -> RuntimeCallError:
    """The 400 for a prompt that leaves no room for an answer in the context.

    Refused, never truncated: what the model would answer to a conversation cut by a rule of ours
    is not an answer to what the client sent, and the record would hold a prompt the client never
    saw. The message starts as Anthropic's does ("prompt is too long: N tokens > M maximum") and
    the body carries OpenAI's ``context_length_exceeded`` code, so agents that compact their
    conversation when the provider says so do it here too.
    """
    where = ("runtime.max_context_tokens" if configured else f"{model}'s context")
    message = (f"prompt is too long: {tokens} tokens > {limit - 1} maximum ({where} is {limit} tokens, the prompt "
               "and at least one answer token). Shorten or compact the conversation.")
    body = {"error": {"message": message, "type": "invalid_request_error", "param": "messages",
                      "code": "context_length_exceeded"}}
    return RuntimeCallError(message, status=400, body=body)


@dataclass
class ChatParams:
    messages: list[dict[str, Any]]
    max_tokens: int | None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    logprobs: bool = False
    tools: list[dict[str, Any]] | None = None


def _number(body: dict, key: str, lo: float, hi: float, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (lo <= value <= hi):
        raise invalid(f"'{key}' must be a number between {lo} and {hi}; got {value!r}.", key)
    return float(value)


#: temperatures below this sample greedily, as vLLM's do: ``logits / T`` would overflow float32
#: for a vanishing ``T`` (1e-40 is a number between 0 and 2), and the NaNs it makes fail the draw
GREEDY_BELOW = 1e-5


def _temperature(body: dict) -> float:
    t = _number(body, "temperature", 0.0, 2.0, 1.0)
    return 0.0 if t < GREEDY_BELOW else t


def parse_chat_request(body: dict[str, Any]) -> ChatParams:
    """Check ``body`` and return what generation needs, or raise a 400 naming the parameter."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list of {role, content} objects.", "messages")
    normalized = [_message(m, i) for i, m in enumerate(messages)]

    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise invalid(
            f"The local runtime returns one choice per request; 'n' must be 1, got {n!r}. Send n separate requests instead.", "n"
        )

    max_tokens = None
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise invalid(f"'{key}' must be a positive integer; got {value!r}.", key)
        max_tokens = value if max_tokens is None else min(max_tokens, value)

    stop = body.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop] if stop else []
    elif isinstance(stop, list) and all(isinstance(s, str) and s for s in stop) and len(stop) <= 16:
        stops = list(stop)
    else:
        raise invalid("'stop' must be a string or a list of up to 16 non-empty strings.", "stop")

    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise invalid(f"'seed' must be an integer; got {seed!r}.", "seed")

    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise invalid(f"The local runtime does not support '{key}'; leave it out or set it to 0.", key)
    if body.get("repetition_penalty") not in (None, 1, 1.0):
        raise invalid("The local runtime does not support 'repetition_penalty'; leave it out or set it to 1.",
                      "repetition_penalty")
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1):
        raise invalid(f"'top_k' must be an integer, -1 or 0 for no limit; got {top_k!r}.", "top_k")
    if body.get("logit_bias"):
        raise invalid("The local runtime does not support 'logit_bias'; leave it out.", "logit_bias")
    if body.get("top_logprobs"):
        raise invalid(
            "The local runtime does not return 'top_logprobs'; leave it out (logprobs: true alone works).", "top_logprobs"
        )

    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("'stream' must be true or false.", "stream")
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise invalid("'logprobs' must be true or false.", "logprobs")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid("'tools' must be a list.", "tools")
    # what would bind the answer's shape, which this runtime cannot: it does not constrain decoding
    # and does not parse tool calls out of the text
    response_format = body.get("response_format")
    kind = response_format.get("type") if isinstance(response_format, dict) else response_format
    if kind not in (None, "text"):
        raise invalid(f"The local runtime does not constrain answers to a format (response_format type {kind!r}); "
                      "leave response_format out, or ask for JSON in the prompt.", "response_format")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise invalid("The local runtime cannot force a tool call (it does not parse tool calls); use tool_choice "
                      "'auto' or 'none', or leave it out.", "tool_choice")

    return ChatParams(
        messages=normalized,
        max_tokens=max_tokens,
        temperature=_temperature(body),
        top_p=_number(body, "top_p", 0.0, 1.0, 1.0),  # 0 keeps only the most likely token
        top_k=max(top_k or 0, 0),
        min_p=_number(body, "min_p", 0.0, 1.0, 0.0),
        stop=stops,
        seed=seed,
        stream=stream,
        logprobs=logprobs,
        tools=tools or None,
    )


def _message(m: Any, i: int) -> dict[str, Any]:
    param = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise invalid(f"{param} needs a 'role' among {sorted(ROLES)}.", param)
    content = m.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise invalid(f"{param}.content: the local runtime takes text parts only.", f"{param}.content")
        content = "".join(parts)
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        raise invalid(f"{param}.content must be a string or a list of text parts.", f"{param}.content")
    out = {k: v for k, v in m.items() if k != "content"}
    out["role"] = "system" if m["role"] == "developer" else m["role"]
    out["content"] = content
    return out


def new_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def completion_body(
    *,
    completion_id: str,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    created: int | None = None,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created or int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": {"content": logprobs} if logprobs is not None else None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def chunk(
    *,
    completion_id: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    usage: dict[str, int] | None = None,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``logprobs``: the ``logprobs.content`` entries it carries."""
    out: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None if logprobs is None else {"content": logprobs},
                     "finish_reason": finish_reason}],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def token_logprobs(tokenizer: Any, token_ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
    """OpenAI's ``choices[].logprobs.content`` entries for the response tokens.

    ``bytes`` are the token's own bytes, so that a client joins a character split over several
    tokens (an emoji, most CJK) from them: a token holding part of a character decodes alone to
    U+FFFD, whose bytes are not the token's."""
    out = []
    for tid, lp in zip(token_ids, logprobs):
        text = tokenizer.decode([tid], skip_special_tokens=False)
        out.append({"token": text, "logprob": lp, "bytes": _token_bytes(tokenizer, tid, text), "top_logprobs": []})
    return out


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character that stands for each byte in its vocabulary."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_LEVEL = _byte_level_alphabet()


def _token_bytes(tokenizer: Any, tid: int, text: str) -> list[int]:
    """The UTF-8 bytes token ``tid`` stands for (``text``: the token decoded alone)."""
    if "\ufffd" in text:
        piece = tokenizer.convert_ids_to_tokens(tid)
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        if isinstance(piece, str) and (m := _BYTE_FALLBACK.fullmatch(piece)):  # SentencePiece's byte fallback
            return [int(m.group(1), 16)]
        if isinstance(piece, str) and piece and "ByteLevel" in repr(decoder) and all(c in _BYTE_LEVEL for c in piece):
            return [_BYTE_LEVEL[c] for c in piece]
    return list(text.encode("utf-8"))
