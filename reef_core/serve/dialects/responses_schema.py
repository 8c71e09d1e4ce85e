"""The Responses request body Reef reads, as a JSON Schema, and the check of a body against it.

One schema serves twice: it is what ``/openapi.json`` publishes for ``POST /v1/responses``, and
``check_types`` holds every client body to it before anything reads the body, so a field of
the wrong type (``"tools": [{"type": []}]``) is a 400 naming it, as OpenAI answers, never a
translator tripping over it. The schema says types only; what a well-typed value may be
(a role, a tool type Reef can carry) is the translator's to refuse, also with a 400.

Every field may be ``null`` (a client's way of leaving it out), and fields the schema does not
name are left alone (OpenAI keeps adding them; Reef records them and sends what it can carry).
"""

from __future__ import annotations

from typing import Any

from ..errors import ClientError

_STRING = {"type": "string"}
_BOOLEAN = {"type": "boolean"}
_NUMBER = {"type": "number"}
_OBJECT = {"type": "object"}


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


#: a content part of a message (``input_text``, ``output_text``, ``input_image``, ``refusal`` …)
CONTENT_PART = _object(type=_STRING, text=_STRING, refusal=_STRING, image_url=_STRING, detail=_STRING,
                       file_id=_STRING)
#: a function tool (top level, or inside a namespace)
FUNCTION_TOOL = _object(type=_STRING, name=_STRING, description=_STRING, parameters=_OBJECT, strict=_BOOLEAN)
#: a tool: a function, a namespace of functions, or a built-in tool (refused by the translator)
TOOL = _object(**FUNCTION_TOOL["properties"], tools=_array(FUNCTION_TOOL))
#: an input item: a message, a function call or its output, a reasoning item …
INPUT_ITEM = _object(
    type=_STRING, role=_STRING, id=_STRING, status=_STRING,
    content={"anyOf": [_STRING, _array(CONTENT_PART)]},
    call_id=_STRING, name=_STRING, namespace=_STRING, arguments=_STRING,
    output={"anyOf": [_STRING, {"type": "array"}]},
)

REQUEST = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "model": _STRING,
        "input": {"anyOf": [_STRING, _array(INPUT_ITEM)]},
        "instructions": _STRING,
        "previous_response_id": _STRING,
        "store": _BOOLEAN,
        "stream": _BOOLEAN,
        "stream_options": _object(include_obfuscation=_BOOLEAN),
        "background": _BOOLEAN,
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "max_tool_calls": {"type": "integer", "minimum": 1},
        "temperature": _NUMBER,
        "top_p": _NUMBER,
        "top_logprobs": {"type": "integer", "minimum": 0},
        "tools": _array(TOOL),
        "tool_choice": {"anyOf": [_STRING, _object(type=_STRING, name=_STRING)]},
        "parallel_tool_calls": _BOOLEAN,
        "text": _object(format=_object(type=_STRING, name=_STRING, description=_STRING, schema=_OBJECT,
                                       strict=_BOOLEAN), verbosity=_STRING),
        "reasoning": _object(effort=_STRING, summary=_STRING),
        "metadata": {"type": "object", "additionalProperties": _STRING},
        "include": _array(_STRING),
        "user": _STRING,
        "safety_identifier": _STRING,
        "prompt_cache_key": _STRING,
        "service_tier": _STRING,
        "truncation": _STRING,
    },
    "additionalProperties": True,
}

_NAMES = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "a boolean",
          "object": "an object", "array": "an array"}


def _is(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    return isinstance(value, list)  # array


def _expected(schema: dict[str, Any]) -> str:
    if "anyOf" in schema:
        return " or ".join(_expected(s) for s in schema["anyOf"])
    text = _NAMES[schema["type"]]
    if "minimum" in schema:
        text += f" of at least {schema['minimum']}"
    return text


def _matches(value: Any, schema: dict[str, Any]) -> bool:
    """Whether ``value`` has the top-level type of ``schema`` (its insides are checked apart)."""
    if "anyOf" in schema:
        return any(_matches(value, s) for s in schema["anyOf"])
    if not _is(value, schema["type"]):
        return False
    return "minimum" not in schema or value >= schema["minimum"]


def _mismatch(value: Any, schema: dict[str, Any], path: list[str | int]) -> tuple[list[str | int], str] | None:
    """The first place where ``value`` breaks ``schema``: (path, what was expected), or None."""
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            if _matches(value, option):
                return _mismatch(value, option, path)
        return path, _expected(schema)
    if not _matches(value, schema):
        return path, _expected(schema)
    if schema["type"] == "array" and "items" in schema:
        for i, item in enumerate(value):
            found = _mismatch(item, schema["items"], [*path, i])
            if found:
                return found
    elif schema["type"] == "object":
        properties = schema.get("properties", {})
        values = schema.get("additionalProperties")
        for key, item in value.items():
            sub = properties.get(key) or (values if isinstance(values, dict) else None)
            if sub is None or item is None:
                continue  # a field the schema does not name, or left out by a null
            found = _mismatch(item, sub, [*path, key])
            if found:
                return found
    return None


def _shown(path: list[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def check_types(body: dict[str, Any]) -> None:
    """Refuse a Responses body with a field of the wrong type: a 400 whose ``param`` is the field's
    dotted path (``tools.0.type``), as OpenAI names it."""
    found = _mismatch(body, REQUEST, [])
    if found is not None:
        path, expected = found
        raise ClientError(f"{_shown(path)}: must be {expected}", param=".".join(str(p) for p in path))
