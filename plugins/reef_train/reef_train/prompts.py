"""A conversation as the prompt token ids the local runtime serves and training replays.

The chat template renders a conversation to text, and the tokenizer turns that text into ids,
parsing every control token it finds (``<|im_start|>``, ``<|im_end|>``, ...) wherever it came
from. A client's message that quotes a control token would then open a turn of its own: a user
could write a system turn into the middle of the conversation, past the server's harness. The
providers Reef stands in for treat what a client writes as text, and so does ``chat_prompt_ids``:
the control tokens the template writes are parsed; those inside the client's strings (message
contents, tool calls, tool definitions) are tokenized as plain text.

A conversation without any control token in its strings (nearly all traffic) takes the usual
path, one render and one tokenization, so its ids are exactly what they always were.
"""

from __future__ import annotations

import re
import secrets
import weakref
from typing import Any


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The prompt ids of ``messages`` (and ``tools``) with the generation prompt, as the runtime
    serves them: control tokens only where the chat template put them."""
    specials = _special_tokens(tokenizer)
    if not specials or not _quotes_any(messages, tools, specials):
        text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return _ids_keeping_client_text(tokenizer, messages, tools, specials)


def _ids_keeping_client_text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                             specials: _Specials) -> list[int]:
    # Each control token inside the client's strings becomes a marker only this call can know
    # (letters and digits: the template's escaping, e.g. tojson, leaves it as is); what the
    # template writes around them is then the only control text left in the rendered prompt.
    marker = f"reef{secrets.token_hex(8)}"
    unmark = re.compile(marker + r"n(\d+)x")

    def mark(s: str) -> str:
        return specials.pattern.sub(lambda m: f"{marker}n{specials.index[m.group()]}x", s)

    text = tokenizer.apply_chat_template(_map_strings(messages, mark), tools=_map_strings(tools, mark),
                                         add_generation_prompt=True, tokenize=False)
    parts = specials.pattern.split(text)  # text, control, text, control, ..., text
    ids: list[int] = []
    for i, part in enumerate(parts):
        if i % 2:
            ids.append(specials.ids[part])
            continue
        # a control token that strips the whitespace beside it does so here as the tokenizer would
        if i > 0 and parts[i - 1] in specials.rstrip:
            part = part.lstrip()
        if i + 1 < len(parts) and parts[i + 1] in specials.lstrip:
            part = part.rstrip()
        if part:
            plain = unmark.sub(lambda m: specials.ordered[int(m.group(1))], part)
            ids.extend(tokenizer(plain, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    return ids


class _Specials:
    """A tokenizer's control tokens: their strings, ids, and how to find them in text."""

    def __init__(self, tokens: dict[str, Any]) -> None:
        self.ordered = sorted(tokens, key=len, reverse=True)  # the longest first, as the tokenizer matches
        self.index = {s: i for i, s in enumerate(self.ordered)}
        self.ids = {s: tokens[s][0] for s in self.ordered}
        self.lstrip = {s for s in self.ordered if tokens[s][1]}
        self.rstrip = {s for s in self.ordered if tokens[s][2]}
        #: any of them, as a group: ``split`` keeps the tokens it splits at
        self.pattern = re.compile("(" + "|".join(map(re.escape, self.ordered)) + ")")

    def __bool__(self) -> bool:
        return bool(self.ordered)


_SEEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _special_tokens(tokenizer: Any) -> _Specials:
    """``tokenizer``'s control tokens, read once per tokenizer (its added tokens do not change
    while it serves)."""
    try:
        return _SEEN[tokenizer]
    except (KeyError, TypeError):
        pass
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = _Specials({t.content: (i, bool(t.lstrip), bool(t.rstrip)) for i, t in decoder.items()
                       if getattr(t, "special", False) and t.content})
    try:
        _SEEN[tokenizer] = found
    except TypeError:  # not weakly referable: read again next time
        pass
    return found


def _quotes_any(messages: Any, tools: Any, specials: _Specials) -> bool:
    return any(token in s for s in (*_strings(messages), *_strings(tools)) for token in specials.ordered)


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):  # keys too: a tool's JSON schema names its properties
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _map_strings(value: Any, fn) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {_map_strings(k, fn): _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_strings(v, fn) for v in value]
    return value


__all__ = ["chat_prompt_ids"]
