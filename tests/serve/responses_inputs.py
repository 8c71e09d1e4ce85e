"""Responses API bodies (hypothesis strategies) drawn from the schema Reef publishes for
``POST /v1/responses`` (``reef_core.serve.dialects.responses_schema.REQUEST``).

- ``acceptable_responses_specs``: bodies an OpenAI client sends (a 200 from a healthy upstream);
- ``typed_responses_specs``: any body whose every field has its schema's type (values arbitrary:
  odd roles, unknown tool types, random ids), so 200 or a 4xx, never a 5xx;
- ``wrong_typed_responses_specs``: a well-typed body with one field, anywhere in the schema (every
  path, array items included), holding a JSON value of another type: a 400 whose ``param`` names
  that field. ``SCHEMA_PATHS`` lists the paths, so a field added to the schema is fuzzed too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from inputs import Body, ChatSpec, big_texts, clean_numbers, clean_texts, clean_values, deep_values, json_values

from reef_core.serve.dialects.responses_schema import REQUEST

Path = tuple[Any, ...]


def schema_paths(schema: dict[str, Any], path: Path = ()) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every field of ``schema`` as (path, its schema); an array's items are at index 0 and an
    object's free-form values at key ``"k"``."""
    if path:
        yield path, schema
    for option in schema.get("anyOf", [schema]):
        if option["type"] == "object":
            for key, sub in option.get("properties", {}).items():
                yield from schema_paths(sub, (*path, key))
            if isinstance(option.get("additionalProperties"), dict):
                yield from schema_paths(option["additionalProperties"], (*path, "k"))
        elif option["type"] == "array" and "items" in option:
            yield from schema_paths(option["items"], (*path, 0))


SCHEMA_PATHS = list(schema_paths(REQUEST))


def has_type(value: Any, schema: dict[str, Any]) -> bool:
    if "anyOf" in schema:
        return any(has_type(value, s) for s in schema["anyOf"])
    kind = schema["type"]
    ok = {"string": isinstance(value, str), "boolean": isinstance(value, bool),
          "integer": isinstance(value, int) and not isinstance(value, bool),
          "number": isinstance(value, (int, float)) and not isinstance(value, bool),
          "object": isinstance(value, dict), "array": isinstance(value, list)}[kind]
    return ok and ("minimum" not in schema or value >= schema["minimum"])


def values_of(schema: dict[str, Any]) -> st.SearchStrategy:
    """Values with ``schema``'s types all the way down (contents arbitrary)."""
    if "anyOf" in schema:
        return st.one_of(*(values_of(s) for s in schema["anyOf"]))
    kind = schema["type"]
    if kind == "string":
        return clean_texts
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(schema.get("minimum", -(2**63)), 2**63 - 1)
    if kind == "number":
        return clean_numbers
    if kind == "array":
        return st.lists(values_of(schema["items"]) if "items" in schema else clean_values, max_size=2)
    properties = schema.get("properties")
    if properties:
        return st.fixed_dictionaries({}, optional={k: st.one_of(st.none(), values_of(s)) for k, s in properties.items()})
    values = schema.get("additionalProperties")
    return st.dictionaries(clean_texts, values_of(values) if isinstance(values, dict) else clean_values, max_size=3)


def wrong_values(schema: dict[str, Any]) -> st.SearchStrategy:
    """Strict JSON values (not null) that do not have ``schema``'s type."""
    values = clean_values.filter(lambda v: v is not None and not has_type(v, schema))
    if "minimum" in schema:  # the right type below the minimum is as wrong
        values = st.one_of(values, st.integers(-(2**63), schema["minimum"] - 1))
    return values


def _option(schema: dict[str, Any], step: Any) -> dict[str, Any]:
    """The option of ``schema`` a path can go through with ``step`` (an index or a key)."""
    kind = "array" if isinstance(step, int) else "object"
    return next(s for s in schema.get("anyOf", [schema]) if s["type"] == kind)


def containing_minimal(schema: dict[str, Any], path: Path, leaf: Any) -> Any:
    """The smallest value of ``schema`` with ``leaf`` at ``path`` (nothing else set)."""
    if not path:
        return leaf
    step, rest = path[0], path[1:]
    option = _option(schema, step)
    if isinstance(step, int):
        return [containing_minimal(option["items"], rest, leaf)]
    sub = option.get("properties", {}).get(step) or option["additionalProperties"]
    return {step: containing_minimal(sub, rest, leaf)}


@st.composite
def containing(draw: Callable, schema: dict[str, Any], path: Path, leaf: Any) -> Any:
    """A value of ``schema``, well-typed everywhere except ``leaf`` at ``path``."""
    if not path:
        return leaf
    step, rest = path[0], path[1:]
    option = _option(schema, step)
    if isinstance(step, int):
        return [draw(containing(option["items"], rest, leaf))]
    properties = option.get("properties", {})
    siblings = {k: s for k, s in properties.items() if k != step}
    value = draw(values_of({"type": "object", "properties": siblings})) if siblings else {}
    value[step] = draw(containing(properties.get(step) or option["additionalProperties"], rest, leaf))
    return value


@dataclass
class ResponsesSpec(ChatSpec):
    """A ``/v1/responses`` request; ``wrong`` is the param a 400 must name (a wrong-typed field)."""

    wrong: str | None = None


def _spec(body: dict[str, Any], wrong: str | None = None) -> ResponsesSpec:
    return ResponsesSpec("responses", Body(body), body.get("stream") is True, wrong)


@st.composite
def wrong_typed_responses_specs(draw: Callable) -> ResponsesSpec:
    path, schema = draw(st.sampled_from(SCHEMA_PATHS))
    leaf = draw(wrong_values(schema))
    body = draw(containing(REQUEST, path, leaf))
    body.setdefault("input", "hi")
    return _spec(body, ".".join(str(p) for p in path))


@st.composite
def typed_responses_specs(draw: Callable) -> ResponsesSpec:
    body = draw(values_of(REQUEST))
    body.setdefault("input", draw(values_of(REQUEST["properties"]["input"])))
    if draw(st.booleans()):  # an unknown field holds anything (even what a strict parser refuses)
        body["x_unknown"] = draw(st.one_of(json_values, deep_values))
    return _spec(body)


_TEXT = st.one_of(clean_texts, big_texts)
_FUNCTION = st.fixed_dictionaries(
    {"type": st.just("function"), "name": st.from_regex(r"[a-z_]{1,10}", fullmatch=True)},
    optional={"description": clean_texts, "strict": st.booleans(),
              "parameters": st.fixed_dictionaries({"type": st.just("object"), "properties": st.just({})})})
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "developer", "assistant"]),
     "content": st.one_of(_TEXT, st.lists(st.fixed_dictionaries({"type": st.just("input_text"), "text": _TEXT}),
                                          min_size=1, max_size=2))},
    optional={"type": st.just("message")})
_OPTIONAL = {
    "instructions": clean_texts, "temperature": st.floats(0, 2), "top_p": st.floats(0, 1),
    "max_output_tokens": st.integers(1, 4096), "parallel_tool_calls": st.booleans(), "store": st.booleans(),
    "tools": st.lists(_FUNCTION, max_size=2), "tool_choice": st.sampled_from(["auto", "none"]),
    "text": st.sampled_from([{"format": {"type": "text"}}, {"format": {"type": "json_object"}}]),
    "metadata": st.dictionaries(clean_texts, clean_texts, max_size=3), "user": clean_texts,
    "reasoning": st.just({"effort": "low"}), "truncation": st.just("disabled"), "include": st.just([]),
    "x_unknown": clean_values,
}


@st.composite
def acceptable_responses_specs(draw: Callable) -> ResponsesSpec:
    """What an OpenAI client sends: a string or messages (the last one the user's), optional fields."""
    if draw(st.booleans()):
        inp: Any = draw(_TEXT)
    else:
        inp = [*draw(st.lists(_MESSAGE, max_size=2)), {"role": "user", "content": draw(_TEXT)}]
    body: dict[str, Any] = {"model": "m", "input": inp}
    for key in draw(st.lists(st.sampled_from(sorted(_OPTIONAL)), max_size=4, unique=True)):
        body[key] = draw(_OPTIONAL[key])
    if draw(st.booleans()):
        body["stream"] = draw(st.booleans())
    return _spec(body)


responses_specs = st.one_of(acceptable_responses_specs(), typed_responses_specs(), wrong_typed_responses_specs())
