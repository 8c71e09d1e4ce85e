"""Hostile inputs for Reef's HTTP surface (hypothesis strategies) and the checks every answer must pass.

Shared by ``test_properties.py``, ``test_fault_injection.py`` and ``bench/soak.py``:

- ``chat_specs(route)``, ``report_specs``, ``header_specs``, ``cursors``, ``record_queries()``,
  ``record_ids``: strategies of request specs, about half acceptable and half hostile. A spec
  renders to an exact request (``Req``) once the receipts it may quote exist (``Ctx``).
- ``send(client, req)``: the request, answered within a bound or ``Hang`` (the record writer is
  watched while waiting: a dead writer is ``WriterDied`` at once instead of a long hang).
- ``judge(req, answer)``: no 5xx from Reef's own code, errors are JSON in the route's shape with
  a message, streams end with their receipt or an in-band error event.
- ``read_back(client, ...)``: whatever was accepted can be read back through every read route.

JSON is rendered by ``dumps`` rather than ``json.dumps`` so a body can hold what a strict
encoder refuses: ``Raw`` literals (``NaN``, 400-digit numbers), ``Deep`` nesting (a thousand
levels, built as text, no recursion) and ``Pairs`` (objects with repeated keys).
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import math
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import strategies as st

from reef_core.testing import parse_sse

CHAT = "/v1/chat/completions"
MSGS = "/v1/messages"
RESPONSES = "/v1/responses"
REPORT = "/reef/report"
ROUTE_PATHS = {"openai": CHAT, "anthropic": MSGS, "responses": RESPONSES}
BOUND_S = 10.0  # every answer within this, or it is a hang

# ---------------------------------------------------------------------------- failures, by kind


class Hang(AssertionError):
    """No complete answer within the bound (or the connection broke without one)."""


class Dropped(Hang):
    """The connection was closed or reset without an answer."""


class WriterDied(AssertionError):
    """The record writer thread is gone: every later write would hang."""


class ServerError(AssertionError):
    """A 5xx that comes from Reef's own code."""


class BadShape(AssertionError):
    """An answer that is not in the route's shape."""


class Lost(AssertionError):
    """An accepted write that cannot be read back."""


# ---------------------------------------------------------------------------- JSON as text


class Raw(str):
    """JSON text inserted as is: ``NaN``, ``1e309``, a 400-digit integer."""

    def __repr__(self) -> str:
        return f"Raw({_short(str(self))})"


class Deep(Raw):
    """``depth`` nested arrays and/or objects around ``leaf``, built as text."""

    depth: int
    kind: str

    def __new__(cls, depth: int, kind: str = "array", leaf: str = '"x"') -> Deep:
        if kind == "array":
            opens, closes = ["["] * depth, ["]"] * depth
        elif kind == "object":
            opens, closes = ['{"a":'] * depth, ["}"] * depth
        else:  # mixed
            opens = ['{"a":' if i % 2 else "[" for i in range(depth)]
            closes = ["}" if i % 2 else "]" for i in range(depth)][::-1]
        obj = super().__new__(cls, "".join(opens) + leaf + "".join(closes))
        obj.depth, obj.kind = depth, kind
        return obj

    def __repr__(self) -> str:
        return f"Deep({self.depth}, {self.kind!r})"


class Pairs(tuple):
    """A JSON object as ``(key, value)`` pairs; keys may repeat (the last one wins in most parsers)."""

    def __repr__(self) -> str:
        return f"Pairs({list(self)!r})"


def _short(text: str, keep: int = 60) -> str:
    return repr(text) if len(text) <= keep else f"{text[:keep]!r}...<{len(text)} chars>"


def dumps(value: Any, ascii_only: bool = True) -> str:
    """JSON text of ``value`` (``Raw``/``Deep`` verbatim, ``Pairs`` as objects, non-finite floats
    as the ``NaN``/``Infinity`` literals Python's parser accepts)."""
    if isinstance(value, Raw):
        return str(value)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=ascii_only)
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{dumps(str(k), ascii_only)}:{dumps(v, ascii_only)}" for k, v in value) + "}"
    if isinstance(value, dict):
        return dumps(Pairs(value.items()), ascii_only)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps(v, ascii_only) for v in value) + "]"
    raise TypeError(f"cannot render {type(value).__name__}")


def encode(value: Any, ascii_only: bool = True) -> bytes:
    """UTF-8 bytes of ``dumps(value)``; lone surrogates pass through as (invalid) bytes."""
    return dumps(value, ascii_only).encode("utf-8", "surrogatepass")


# ---------------------------------------------------------------------------- leaf strategies

SPECIAL_TEXT = ["", " ", "\x00", "a\x00b", "\ud800", "\udfff", "\ufeff", "\u202e", "\U0001f600", "NaN", "null",
                "\\", '"', "\r\n", "é", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "<script>", "%00", "../../etc/passwd"]
NUMBER_LITERALS = [Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e309"), Raw("-1e309"), Raw("1" + "0" * 400),
                   Raw("-" + "9" * 400), Raw("-0"), Raw("1E-400"), Raw("0.1e+0001"), Raw("1.0e-5")]
DEPTHS = [1, 2, 10, 62, 63, 64, 65, 66, 100, 199, 200, 201, 250, 252, 253, 254, 255, 256, 257, 300, 500, 990,
          995, 1000, 1024, 1025, 1100]

texts = st.one_of(st.text(max_size=20), st.sampled_from(SPECIAL_TEXT))
# URLs carry UTF-8: no lone surrogates in query values and path segments
url_texts = texts.map(lambda s: "".join(c for c in s if not 0xD800 <= ord(c) <= 0xDFFF))
big_texts = st.integers(10_000, 300_000).map(lambda n: "é" * n)  # one word: one stream event
numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from(NUMBER_LITERALS))
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)


def _objects(children: st.SearchStrategy) -> st.SearchStrategy:
    plain = st.dictionaries(texts, children, max_size=4)
    repeated = st.lists(st.tuples(st.sampled_from(["a", "b", "a"]), children), min_size=2, max_size=4).map(Pairs)
    return st.one_of(plain, repeated)


json_values = st.recursive(scalars, lambda ch: st.one_of(st.lists(ch, max_size=4), _objects(ch)), max_leaves=12)

# What a strict JSON parser accepts: no lone surrogates, no NaN, integers within 64 bits.
clean_texts = st.one_of(st.text(st.characters(exclude_categories=["Cs"]), max_size=20),
                        st.sampled_from([t for t in SPECIAL_TEXT if not any(0xD800 <= ord(c) <= 0xDFFF for c in t)]))
clean_numbers = st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False))
clean_values = st.recursive(st.one_of(st.none(), st.booleans(), clean_numbers, clean_texts),
                            lambda ch: st.one_of(st.lists(ch, max_size=4), st.dictionaries(clean_texts, ch, max_size=4)),
                            max_leaves=12)
deep_values = st.builds(Deep, st.one_of(st.sampled_from(DEPTHS), st.integers(0, 1100)),
                        st.sampled_from(["array", "object", "mixed"]),
                        st.sampled_from(['"x"', "1", "null", "{}", "[]", '"\\ud800"', "NaN"]))
any_values = st.one_of(json_values, deep_values)

# ---------------------------------------------------------------------------- requests


@dataclass
class Ctx:
    """What a spec may quote: the scenario of this example, a receipt of it, a receipt of another."""

    scenario: str
    own: list[str] = field(default_factory=list)
    other: str = "rec_none"


@dataclass
class Req:
    """One exact HTTP request; ``repr`` prints it so a failing example replays by hand."""

    method: str
    path: str
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    content: bytes | None = None
    params: list[tuple[str, str]] | None = None
    stream: bool = False
    scenario: str | None = None  # where an accepted write must show up
    kind: str = "read"  # chat | report | read

    def __repr__(self) -> str:
        parts = [f"{self.method} {self.path}"]
        if self.params:
            parts.append("params=[" + ", ".join(f"({k!r}, {_short(v)})" for k, v in self.params) + "]")
        if self.headers:
            parts.append("headers=[" + ", ".join(f"({k!r}, {_short_bytes(v, 80)})" for k, v in self.headers) + "]")
        if self.content is not None:
            parts.append(f"body={_short_bytes(self.content)}")
        return "Req(" + ", ".join(parts) + ")"


_RUN = re.compile(rb"(.{1,5}?)\1{11,}", re.S)


def _short_bytes(data: bytes, keep: int = 600) -> str:
    """``data`` as a Python expression that rebuilds it, long runs folded:
    ``b'{"x":' + b'[' * 995 + b'"x"' + b']' * 995 + b'}'``."""
    parts, pos = [], 0
    for m in _RUN.finditer(data):
        if m.start() > pos:
            parts.append(repr(data[pos:m.start()]))
        unit = m.group(1)
        parts.append(f"{unit!r} * {len(m.group(0)) // len(unit)}")
        pos = m.end()
    if pos < len(data):
        parts.append(repr(data[pos:]))
    text = " + ".join(parts) or "b''"
    return text if len(text) <= keep else text[:keep] + f"...<{len(data)} bytes>"


JSON_HEADERS = [(b"content-type", b"application/json")]


@dataclass
class Body:
    """A JSON document and how it is mangled on the wire."""

    value: Any
    ascii_only: bool = True
    mangle: str = "none"

    def __repr__(self) -> str:
        return f"Body({_short_bytes(self.render())})"

    def render(self) -> bytes:
        data = encode(self.value, self.ascii_only)
        if self.mangle == "trailing":
            return data + b" {"
        if self.mangle == "bom":
            return b"\xef\xbb\xbf" + data
        if self.mangle == "truncated":
            return data[: max(1, len(data) // 2)]
        if self.mangle == "latin1":
            return data.replace(b"a", b"\xe9", 1)
        if self.mangle == "nan":
            return data.replace(b"}", b',"nan_field":NaN}', 1) if data.startswith(b"{") else data
        return data


mangles = st.sampled_from(["none", "none", "none", "none", "trailing", "bom", "truncated", "latin1", "nan"])


def _content(route: str) -> st.SearchStrategy:
    if route == "anthropic":
        blocks = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image", "tool_result", "x"]),
                                                 "text": texts}), min_size=1, max_size=3)
    else:
        blocks = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]),
                                                 "text": texts}), min_size=1, max_size=3)
    return st.one_of(texts, blocks, big_texts, any_values)


def _message(route: str) -> st.SearchStrategy:
    roles = ["user", "assistant"] if route == "anthropic" else ["user", "assistant", "system", "tool", "developer"]
    good = st.fixed_dictionaries({"role": st.just("user"), "content": texts})
    odd = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(roles), scalars), "content": _content(route)},
                                optional={"name": scalars, "tool_calls": any_values, "tool_call_id": scalars,
                                          "extra": any_values})
    return st.one_of(good, odd, any_values)


_OPTIONAL = {
    "openai": ["temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "tools", "tool_choice",
               "stream_options", "n", "user", "metadata", "response_format", "logprobs", "seed"],
    "anthropic": ["system", "temperature", "top_p", "top_k", "stop_sequences", "tools", "tool_choice", "metadata",
                  "thinking"],
}


@dataclass
class ChatSpec:
    """An inference request: its body and the x-reef headers it carries (besides the scenario)."""

    route: str  # the client's dialect: openai | anthropic | responses
    body: Body
    stream: bool

    def build(self, ctx: Ctx, headers: list[tuple[bytes, bytes]] | None = None) -> Req:
        hdrs = [*JSON_HEADERS, (b"x-reef-scenario", ctx.scenario.encode())] if headers is None \
            else [*JSON_HEADERS, *headers]
        return Req("POST", ROUTE_PATHS[self.route], hdrs, self.body.render(), stream=self.stream,
                   scenario=ctx.scenario, kind="chat")


_CLEAN_OPTIONAL = {
    "openai": {"temperature": st.floats(0, 2), "max_tokens": st.integers(1, 4096), "stop": st.lists(clean_texts, max_size=2),
               "user": clean_texts, "metadata": st.dictionaries(clean_texts, clean_texts, max_size=3),
               "seed": clean_numbers, "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
               "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
                   {"name": st.from_regex(r"[a-z_]{1,10}", fullmatch=True), "parameters": st.dictionaries(
                       clean_texts, clean_values, max_size=3)})}), max_size=2),
               "x_unknown": clean_values},
    "anthropic": {"temperature": st.floats(0, 1), "system": clean_texts, "stop_sequences": st.lists(clean_texts, max_size=2),
                  "metadata": st.fixed_dictionaries({"user_id": clean_texts}), "top_k": st.integers(1, 100),
                  "tools": st.lists(st.fixed_dictionaries({"name": st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
                                                           "input_schema": st.dictionaries(clean_texts, clean_values,
                                                                                           max_size=3)}), max_size=2),
                  "x_unknown": clean_values},
}


@st.composite
def acceptable_chat_specs(draw: Callable, route: str) -> ChatSpec:
    """Bodies a provider would take: unicode, big strings, odd model names, optional fields,
    repeated keys, values nested up to just under the depth limit."""
    text = st.one_of(clean_texts, big_texts)
    if route == "anthropic":
        content = st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}),
                                           min_size=1, max_size=2))
        roles = st.just("user")
    else:
        content = st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}),
                                           min_size=1, max_size=2))
        roles = st.sampled_from(["user", "system", "developer"])
    messages = draw(st.lists(st.fixed_dictionaries({"role": roles, "content": content}), min_size=0, max_size=2))
    body: dict[str, Any] = {"model": draw(st.one_of(st.just("m"), clean_texts)),
                            "messages": [*messages, {"role": "user", "content": draw(content)}]}
    if route == "anthropic":
        body["max_tokens"] = draw(st.integers(1, 4096))
    stream = draw(st.booleans())
    if stream or draw(st.booleans()):
        body["stream"] = stream
    for key in draw(st.lists(st.sampled_from(sorted(_CLEAN_OPTIONAL[route])), max_size=3, unique=True)):
        body[key] = draw(_CLEAN_OPTIONAL[route][key])
    if draw(st.integers(0, 3)) == 0:  # nested as deep as a client may (body depth 64 in all)
        body["x_nested"] = Deep(draw(st.integers(1, 62)), draw(st.sampled_from(["array", "object", "mixed"])))
    value: Any = body
    if draw(st.integers(0, 3)) == 0:  # a repeated key whose last value is still valid
        value = Pairs([("stream", "junk"), ("model", 3), *body.items()])
    return ChatSpec(route, Body(value, draw(st.booleans())), stream)


@st.composite
def hostile_chat_specs(draw: Callable, route: str) -> ChatSpec:
    """Wrong types, junk messages, NaN literals, 400-digit numbers, nesting up to 1,100 levels,
    repeated keys, invalid UTF-8, truncated documents, non-objects."""
    body: dict[str, Any] = {"model": draw(st.one_of(st.just("m"), texts, scalars)),
                            "messages": draw(st.one_of(st.lists(_message(route), min_size=1, max_size=3),
                                                       st.lists(_message(route), max_size=0), any_values))}
    if route == "anthropic":
        body["max_tokens"] = draw(st.one_of(st.just(16), st.integers(-5, 2**40), scalars))
    stream = draw(st.sampled_from([None, False, True, "yes", 1]))
    if stream is not None:
        body["stream"] = stream
    for key in draw(st.lists(st.sampled_from(_OPTIONAL[route]), max_size=3, unique=True)):
        body[key] = draw(any_values)
    if draw(st.booleans()):  # a deep value somewhere a client could put one
        where = draw(st.sampled_from(["x", "metadata", "tools", "messages"]))
        deep = draw(deep_values)
        if where == "tools":
            body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": deep}}]
        elif where == "messages":
            body["messages"] = [{"role": "user", "content": "hi"}, deep]
        else:
            body[where] = deep
    value: Any = body
    if draw(st.integers(0, 5)) == 0:  # repeated keys: the last one wins in most parsers
        key = draw(st.sampled_from(list(body)))
        value = Pairs([*body.items(), (key, draw(any_values))])
    if draw(st.integers(0, 9)) == 0:
        value = draw(any_values)  # not an object at all
    return ChatSpec(route, Body(value, draw(st.booleans()), draw(mangles)), stream is True)


def chat_specs(route: str) -> st.SearchStrategy:
    """Chat Completions (``openai``) or Messages (``anthropic``) bodies: half acceptable, half hostile."""
    return st.one_of(acceptable_chat_specs(route), hostile_chat_specs(route))


# ---------------------------------------------------------------------------- headers

_TOKEN_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~"
_VALUE_BYTES = bytes([9, 32, *range(33, 127), *range(128, 256)])


def _value_bytes(max_size: int) -> st.SearchStrategy:
    """Header values an HTTP/1.1 client can send: no CR/LF/NUL, no surrounding whitespace."""
    return st.binary(max_size=max_size).map(
        lambda b: bytes(_VALUE_BYTES[x % len(_VALUE_BYTES)] for x in b).strip(b" \t"))


valid_scenarios = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,30}", fullmatch=True)
scenario_values = st.one_of(valid_scenarios.map(str.encode), _value_bytes(40),
                            st.sampled_from([b"a" * 200, b"a" * 201, b"b" * 5000, b"..", b"-a", b"a/b", b"a\xa0",
                                             b"\xc3\xa9t\xc3\xa9", b"default"]))


@dataclass
class HeaderSpec:
    """x-reef-* headers (and junk ones): scenario, session, tags; maybe one huge header."""

    scenario: bytes | None
    session: bytes | None
    tags: list[tuple[str, bytes]]
    junk: int
    huge: int

    def __repr__(self) -> str:
        return "HeaderSpec([" + ", ".join(f"({k!r}, {_short_bytes(v, 80)})" for k, v in self.headers()) + "])"

    def headers(self) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        if self.scenario is not None:
            out.append((b"x-reef-scenario", self.scenario))
        if self.session is not None:
            out.append((b"x-reef-session", self.session))
        out += [(b"x-reef-tag-" + k.encode(), v) for k, v in self.tags]
        out += [(f"x-junk-{i}".encode(), b"j" * (i % 7)) for i in range(self.junk)]
        if self.huge:
            out.append((b"x-reef-tag-huge", b"h" * self.huge))
        return out

    def expected_scenario(self, default: str) -> list[str]:
        """Where an accepted request must be recorded (surrounding whitespace may be trimmed)."""
        if self.scenario is None:
            return [default]
        text = self.scenario.decode("latin-1")
        return [text, text.strip()] if text.strip() else [default]

    def expected_tags(self) -> set[str]:
        names = {k.lower() for k, _ in self.tags if k}
        if self.huge:
            names.add("huge")
        return names


header_specs = st.builds(
    HeaderSpec,
    scenario=st.one_of(st.none(), scenario_values),
    session=st.one_of(st.none(), _value_bytes(300), st.just(b"s" * 5000)),
    tags=st.lists(st.tuples(st.text(_TOKEN_CHARS, max_size=12), _value_bytes(60)), max_size=40),
    junk=st.sampled_from([0, 0, 0, 5, 100]),
    huge=st.sampled_from([0, 0, 0, 0, 0, 20_000, 33_000, 70_000]),
)

# ---------------------------------------------------------------------------- reports

REF_KINDS = ["own", "own", "unknown", "other", "junk"]


@dataclass
class ReportSpec:
    """A feedback report; ``references`` name receipt kinds resolved against a ``Ctx``."""

    fields: dict[str, Any]
    references: Any  # list of REF_KINDS / junk values, or junk, or absent (None)
    junk_refs: list[Any]
    duplicate: str | None
    body: Body

    def resolve(self, ctx: Ctx) -> Any:
        if not isinstance(self.references, list):
            return self.references
        unknown = iter(f"rec_{uuid.uuid5(uuid.NAMESPACE_URL, f'{ctx.scenario}/{i}').hex}" for i in range(99))
        junk = iter(self.junk_refs + [None] * len(self.references))
        out = []
        for kind in self.references:
            if kind == "own":
                out.append(ctx.own[0] if ctx.own else "rec_missing")
            elif kind == "unknown":
                out.append(next(unknown))
            elif kind == "other":
                out.append(ctx.other)
            else:
                out.append(next(junk))
        return out

    def build(self, ctx: Ctx) -> Req:
        items = list(self.fields.items())
        if self.references != "absent":
            items.append(("references", self.resolve(ctx)))
        if self.duplicate:
            items.append((self.duplicate, "duplicate"))
        body = Body(Pairs(items), self.body.ascii_only, self.body.mangle)
        return Req("POST", REPORT, [*JSON_HEADERS, (b"x-reef-scenario", ctx.scenario.encode())], body.render(),
                   scenario=ctx.scenario, kind="report")


@st.composite
def acceptable_report_specs(draw: Callable) -> ReportSpec:
    """Reports the API documents as valid, quoting this scenario's receipt (maybe with an
    unknown or other-scenario receipt next to it: 404/409)."""
    optional = {
        "score": st.one_of(st.floats(-1e300, 1e300), st.integers(-(2**53), 2**53), st.none()),
        "feedback": st.one_of(clean_texts, big_texts, st.dictionaries(clean_texts, clean_values, max_size=3),
                              st.builds(lambda d: {"note": Deep(d, "object")}, st.integers(1, 60))),
        "metadata": st.one_of(st.dictionaries(clean_texts, clean_values, max_size=3),
                              st.builds(lambda d: {"deep": Deep(d, "mixed")}, st.integers(1, 60))),
        "report_id": st.one_of(st.uuids().map(str), clean_texts.filter(bool), st.just("r" * 200)),
    }
    fields = {k: draw(optional[k]) for k in draw(st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True))}
    references = ["own", *draw(st.lists(st.sampled_from(["unknown", "other", "own"]), max_size=1))]
    return ReportSpec(fields, references, [], None, Body(None, draw(st.booleans())))


@st.composite
def hostile_report_specs(draw: Callable) -> ReportSpec:
    fields: dict[str, Any] = {}
    optional = {
        "score": st.one_of(st.floats(-1e6, 1e6), st.integers(-(2**64), 2**64), numbers, st.booleans(), texts,
                           json_values),
        "feedback": st.one_of(texts, big_texts, json_values, deep_values,
                              st.builds(lambda d: {"note": d}, deep_values)),
        "metadata": st.one_of(st.dictionaries(texts, json_values, max_size=3), json_values,
                              st.builds(lambda d: {"deep": d}, deep_values)),
        "report_id": st.one_of(st.uuids().map(str), texts, st.just("r" * 200), st.just("r" * 201), scalars),
        "unexpected_field": json_values,
    }
    for key in draw(st.lists(st.sampled_from(list(optional)), max_size=5, unique=True)):
        fields[key] = draw(optional[key])
    references = draw(st.one_of(st.lists(st.sampled_from(REF_KINDS), min_size=1, max_size=4),
                                st.just([]), st.just("absent"), st.just(["own"] * 1001), scalars))
    junk_refs = draw(st.lists(st.one_of(texts, st.just("rec_" + "x" * 5000), json_values), max_size=4))
    duplicate = draw(st.one_of(st.none(), st.sampled_from(["score", "references", "feedback"])))
    return ReportSpec(fields, references, junk_refs, duplicate, Body(None, draw(st.booleans()), draw(mangles)))


report_specs = st.one_of(acceptable_report_specs(), hostile_report_specs())


# ---------------------------------------------------------------------------- read routes


def _b64(data: bytes, pad: bool) -> str:
    text = base64.urlsafe_b64encode(data).decode()
    return text if pad else text.rstrip("=")


_CURSOR_S = [Raw("1e309"), Raw("-1e309"), Raw("NaN"), Raw("1" + "0" * 400), Raw("-" + "9" * 400), -1, 0, 1, 2**63,
             -(2**63) - 1, "abc", "12", "", None, [], {}, True, 1.5, Deep(300)]
_CURSOR_D = [0, 1, True, False, "x", None, [], 2, Raw("NaN"), Raw("1" + "0" * 400)]


@st.composite
def _crafted_cursor(draw: Callable) -> str:
    obj: list[tuple[str, Any]] = []
    if draw(st.integers(0, 5)):
        obj.append(("s", draw(st.one_of(st.sampled_from(_CURSOR_S), numbers))))
    if draw(st.integers(0, 5)):
        obj.append(("d", draw(st.sampled_from(_CURSOR_D))))
    if not draw(st.integers(0, 5)):
        obj.append(("x", draw(json_values)))
    return _b64(encode(Pairs(obj)), draw(st.booleans()))


cursors = st.one_of(
    _crafted_cursor(),
    st.binary(max_size=64).map(lambda b: _b64(b, False)),
    st.builds(lambda v, pad: _b64(encode(v), pad), any_values, st.booleans()),
    url_texts,
    st.sampled_from(["", "=", "====", "A" * 40_000, "%", "e30", _b64(b'{"s":1e309,"d":1}', False),
                     _b64(b'{"s":' + b"1" * 400 + b',"d":1}', False), _b64(b'{"s":-5,"d":0}', False)]),
)


def _iso(dt: datetime, offset_minutes: int | None) -> str:
    if offset_minutes is None:
        return dt.isoformat()
    return dt.replace(tzinfo=timezone(timedelta(minutes=offset_minutes))).isoformat()


times = st.one_of(
    st.builds(_iso, st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
              st.one_of(st.none(), st.integers(-(23 * 60 + 59), 23 * 60 + 59))),
    st.sampled_from(["0001-01-01T00:00:00-05:00", "9999-12-31T23:59:59+14:00", "0001-01-01T00:00:00+23:59",
                     "9999-12-31T23:59:59-23:59", "0000-00-00", "2024-02-30T00:00:00", "1e309", "-1", "0",
                     "99999999999999999999", "now", "", "2024-01-01T00:00:00.9999999999Z", "99999-01-01",
                     "2024-01-01T00:00:00+99:00", "1" * 400]),
    st.integers(-(2**63), 2**63).map(str),
    url_texts,
)

_QUERY = {
    "since": times, "until": times,
    "limit": st.one_of(st.integers(-5, 600).map(str), st.sampled_from(["1e3", "", "0x10", "1" * 400, "NaN"]),
                      url_texts),
    "order": st.one_of(st.sampled_from(["newest", "oldest"]), url_texts),
    "status": st.one_of(st.sampled_from(["ok", "error", "incomplete"]), url_texts),
    "kind": st.one_of(st.just("inference"), url_texts),
    "session": st.one_of(st.just("s1"), url_texts, st.just("s" * 5000)),
    "cursor": cursors,
}


@st.composite
def record_queries(draw: Callable) -> list[tuple[str, str]]:
    """Query parameters of ``GET /reef/scenarios/{s}/records``, each odd on its own or together."""
    keys = draw(st.lists(st.sampled_from(list(_QUERY)), max_size=4, unique=True))
    params = [(k, draw(_QUERY[k])) for k in keys]
    if draw(st.integers(0, 9)) == 0 and params:
        params.append(params[0])  # the same parameter twice
    return params


record_ids = st.one_of(st.uuids().map(lambda u: f"rec_{u.hex}"), url_texts.filter(bool), st.just("r" * 5000),
                       st.sampled_from(["..", "%2e%2e", "rec_\x00", "rec_'; drop table records;--"]))


def scenario_path(scenario: str) -> str:
    return quote(scenario, safe="")


# ---------------------------------------------------------------------------- sending


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes
    seconds: float

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def receipt(self) -> str | None:
        return self.headers.get("x-reef-agent-record-id")


_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="reef-probe")


def _do(client: httpx.Client, req: Req, bound: float) -> Answer:
    started = time.monotonic()
    with client.stream(req.method, req.path, headers=req.headers, content=req.content, params=req.params,
                       timeout=bound) as resp:
        chunks = []
        for chunk in resp.iter_raw():
            chunks.append(chunk)
            if time.monotonic() - started > bound:
                raise Hang(f"no complete answer within {bound}s (still streaming): {req!r}")
        return Answer(resp.status_code, resp.headers, b"".join(chunks), time.monotonic() - started)


def send(client: httpx.Client, req: Req, *, bound: float = BOUND_S, alive: Callable[[], bool] | None = None) -> Answer:
    """Send ``req`` and read the whole answer within ``bound`` seconds; ``alive`` (the record
    writer's liveness) is polled meanwhile so a dead writer fails at once, not after the bound."""
    if alive is None:
        try:
            return _do(client, req, bound)
        except httpx.TimeoutException:
            raise Hang(f"no answer within {bound}s: {req!r}") from None
        except httpx.TransportError as exc:
            raise Dropped(f"the connection broke without an answer ({type(exc).__name__}: {exc}): {req!r}") from None
    fut = _POOL.submit(_do, client, req, bound)
    deadline = time.monotonic() + bound + 1
    while True:
        try:
            return fut.result(timeout=0.05)
        except concurrent.futures.TimeoutError:
            if not alive():
                raise WriterDied(f"the record writer thread died while serving {req!r}") from None
            if time.monotonic() > deadline:
                raise Hang(f"no answer within {bound}s: {req!r}") from None
        except httpx.TimeoutException:
            raise Hang(f"no answer within {bound}s: {req!r}") from None
        except httpx.TransportError as exc:
            raise Dropped(f"the connection broke without an answer ({type(exc).__name__}: {exc}): {req!r}") from None


class ShrinkBudget:
    """Caps the time hypothesis spends shrinking: ``seconds`` after the first failure, only
    examples already seen failing run again (the others pass at once), so the report is the
    smallest failing example found by then and replays as a failure."""

    def __init__(self, seconds: float = 8.0, on_failure: Callable[[], None] | None = None):
        self.seconds = seconds
        self.on_failure = on_failure
        self.first_failure: float | None = None
        self.failed: set[Any] = set()

    def run(self, key: Any, fn: Callable[[], None]) -> None:
        if (self.first_failure is not None and time.monotonic() - self.first_failure > self.seconds
                and key not in self.failed):
            return
        try:
            fn()
        except BaseException:
            self.failed.add(key)
            if self.first_failure is None:
                self.first_failure = time.monotonic()
            if self.on_failure is not None:
                self.on_failure()
            raise


# ---------------------------------------------------------------------------- judging


def route_dialect(path: str) -> str:
    return "openai" if path in (CHAT, RESPONSES) else "anthropic" if path == MSGS else "reef"


def check_error_shape(path: str, answer: Answer) -> None:
    """An error answer is JSON in the route's shape, with a message."""
    try:
        body = answer.json()
    except ValueError:
        raise BadShape(f"{answer.status} answer is not JSON: {answer.body[:300]!r}") from None
    dialect = route_dialect(path)
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str) or not err["message"]:
        raise BadShape(f"{answer.status} answer has no error message: {body!r:.300}")
    if dialect == "openai" and set(err) != {"message", "type", "param", "code"}:
        raise BadShape(f"{answer.status} answer is not in OpenAI's error shape: {body!r:.300}")
    if dialect == "anthropic" and (body.get("type") != "error" or not err.get("type")):
        raise BadShape(f"{answer.status} answer is not in Anthropic's error shape: {body!r:.300}")
    if dialect == "reef" and not err.get("type"):
        raise BadShape(f"{answer.status} answer has no error type: {body!r:.300}")


def stream_end(answer: Answer) -> str:
    """How a 200 stream ended: ``ok`` (the last event carries the receipt), ``error`` (an
    in-band error event), or ``broken`` (neither)."""
    body, start = answer.body, len(answer.body)
    for _ in range(3):  # only the last events matter, however long (a Responses one holds the whole answer)
        found = body.rfind(b"\n\n", 0, start - 1)
        start = found + 2 if found >= 0 else 0
        if found < 0:
            break
    events = parse_sse(body[start:].decode("utf-8", "replace"))
    for _, data in reversed(events):
        if isinstance(data, dict):
            if isinstance(data.get("reef"), dict):
                return "ok" if data["reef"].get("agent_record_id") == answer.receipt else "broken"
            if data.get("type") == "error" or "error" in data:
                return "error"
    return "broken"


def judge(req: Req, answer: Answer, *, upstream_failed: Callable[[Answer], bool] | None = None) -> None:
    """No 5xx from Reef's own code; errors in the route's shape; a stream ends with its receipt
    or an error event. ``upstream_failed(answer)`` says whether a 5xx is one the upstream was
    told to send (relayed), and so allowed."""
    if answer.status >= 500 and not (upstream_failed and upstream_failed(answer)):
        raise ServerError(f"{answer.status} from Reef: {answer.body[:300]!r} for {req!r}")
    if 300 <= answer.status < 400:  # e.g. a trailing-slash redirect: fine when it says where to
        if not answer.headers.get("location"):
            raise BadShape(f"{answer.status} without a location for {req!r}")
        return
    if answer.status == 200:
        if req.kind == "chat" and not answer.receipt:
            raise BadShape(f"200 without a receipt header for {req!r}")
        if req.kind == "chat" and answer.headers.get("content-type", "").startswith("text/event-stream"):
            if stream_end(answer) == "broken":
                raise BadShape(f"a 200 stream ended with neither its receipt nor an error event: "
                               f"{answer.body[-300:]!r} for {req!r}")
        else:
            try:
                answer.json()
            except ValueError:
                raise BadShape(f"200 answer is not JSON: {answer.body[:300]!r} for {req!r}") from None
        return
    try:
        check_error_shape(req.path, answer)
    except BadShape as exc:
        raise BadShape(f"{exc} for {req!r}") from None


# ---------------------------------------------------------------------------- reading back


def _get(client: httpx.Client, path: str, params: Any = None) -> Answer:
    return send(client, Req("GET", path, params=params))


def get_record(client: httpx.Client, receipt: str, *, wait_s: float = 0.0) -> dict[str, Any]:
    """``GET /reef/records/{receipt}``; a 404 is retried for ``wait_s`` (records of broken
    streams are queued, not awaited, before the last byte goes out)."""
    deadline = time.monotonic() + wait_s
    while True:
        answer = _get(client, f"/reef/records/{quote(receipt, safe='')}")
        if answer.status == 404 and time.monotonic() < deadline:
            time.sleep(0.05)
            continue
        if answer.status != 200:
            raise Lost(f"GET /reef/records/{receipt} answered {answer.status}: {answer.body[:300]!r}")
        record = answer.json()
        if record.get("id") != receipt:
            raise Lost(f"GET /reef/records/{receipt} answered another record: {record.get('id')!r}")
        return record


def all_pages(client: httpx.Client, scenario: str, params: list[tuple[str, str]] | None = None, *,
              max_pages: int = 400) -> list[dict[str, Any]]:
    """Every record of a listing, following ``next_cursor`` until null; must terminate, each
    page 200, no record twice."""
    path = f"/reef/scenarios/{scenario_path(scenario)}/records"
    base = [(k, v) for k, v in (params or []) if k != "cursor"]
    cursor = next((v for k, v in (params or []) if k == "cursor"), None)
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(max_pages):
        answer = _get(client, path, base + ([("cursor", cursor)] if cursor else []))
        if answer.status != 200:
            raise Lost(f"GET {path} {base} cursor={cursor!r} answered {answer.status}: {answer.body[:300]!r}")
        page = answer.json()
        for rec in page["records"]:
            if rec["id"] in seen:
                raise Lost(f"GET {path}: record {rec['id']} listed twice while paging")
            seen[rec["id"]] = rec
        cursor = page["next_cursor"]
        if cursor is None:
            return list(seen.values())
        if not page["records"]:
            raise Lost(f"GET {path}: an empty page with a next_cursor ({cursor!r})")
    raise Lost(f"GET {path} {base}: paging did not end within {max_pages} pages")


def read_back_record(client: httpx.Client, receipt: str, scenario: str | list[str], status: str, *,
                     wait_s: float = 0.0, limit: int = 50, order: str = "newest") -> dict[str, Any]:
    """The record is readable by id and through every page of its scenario's listing."""
    record = get_record(client, receipt, wait_s=wait_s)
    scenarios = [scenario] if isinstance(scenario, str) else scenario
    if record.get("scenario") not in scenarios:
        raise Lost(f"record {receipt} is in scenario {record.get('scenario')!r}, not {scenarios!r}")
    if record.get("status") != status:
        raise Lost(f"record {receipt} has status {record.get('status')!r}, expected {status!r} "
                   f"(error: {record.get('error')!r})")
    listed = all_pages(client, record["scenario"], [("limit", str(limit)), ("order", order)])
    if receipt not in {r["id"] for r in listed}:
        raise Lost(f"record {receipt} is missing from the pages of scenario {record['scenario']!r}")
    return record


def read_back_chat(client: httpx.Client, req: Req, answer: Answer, *, scenario: str | list[str] | None = None,
                   limit: int = 50, order: str = "newest") -> dict[str, Any] | None:
    """After an inference answer with a receipt: its record reads back with the right status."""
    if not answer.receipt:
        return None
    if answer.status != 200:
        status = "error"
    elif answer.headers.get("content-type", "").startswith("text/event-stream"):
        status = "ok" if stream_end(answer) == "ok" else "incomplete"
    else:
        status = "ok"
    try:
        return read_back_record(client, answer.receipt, scenario or req.scenario or "default", status,
                                wait_s=0 if status == "ok" else 5, limit=limit, order=order)
    except Lost as exc:
        raise Lost(f"{exc}; the answer was {answer.status} {answer.body[-200:]!r} to {req!r}") from None


def read_back_report(client: httpx.Client, req: Req, answer: Answer) -> None:
    """After a 200 report: every record it quotes lists it, by id and in the listing."""
    try:
        _read_back_report(client, answer)
    except Lost as exc:
        raise Lost(f"{exc}; the report was {req!r}") from None


def _read_back_report(client: httpx.Client, answer: Answer) -> None:
    out = answer.json()
    report_id = out.get("report_id")
    refs = out.get("references")
    if not isinstance(report_id, str) or not isinstance(refs, list) or not refs:
        raise BadShape(f"200 report answer without report_id/references: {out!r:.300}")
    for ref in dict.fromkeys(refs):
        record = get_record(client, ref)
        if report_id not in {r.get("id") for r in record.get("reports", [])}:
            raise Lost(f"report {report_id} is missing from GET /reef/records/{ref}")
        listed = {r["id"]: r for r in all_pages(client, record["scenario"], [("limit", "50")])}
        if ref not in listed or report_id not in {r.get("id") for r in listed[ref].get("reports", [])}:
            raise Lost(f"report {report_id} on {ref} is missing from the pages of {record['scenario']!r}")
