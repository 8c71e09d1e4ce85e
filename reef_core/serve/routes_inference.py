"""Provider-compatible inference routes: ``/v1/chat/completions``, ``/v1/messages``, ``/v1/responses``,
``/v1/models``."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from ..errors import NotFoundError
from ..store import new_id
from . import jsonfast
from .auth import Principal, check_scenario, require_role
from .dialects.responses_api import input_items, output_as_input
from .dialects.responses_schema import REQUEST as RESPONSES_REQUEST
from .dialects.responses_schema import check_types
from .errors import ClientError
from .inference import Exchange, complete, stream
from .responses_native import is_native, output_items_as_input, retrieve_upstream
from .scenarios import header_scenario
from .state import ServeState

router = APIRouter(tags=["inference"])

_TAG_PREFIX = "x-reef-tag-"
_MAX_TAGS = 32

_infer = Depends(require_role("infer"))

#: the release whose harness the client installed (``reef agent install`` writes it into the
#: agent's settings): when it is the one serving, Reef does not inject that harness again
INSTALLED_HEADER = "x-reef-installed-release"

_REEF_HEADERS_DOC = {
    "x-reef-agent-record-id": {"description": "The receipt: id of the record of this request.",
                               "schema": {"type": "string"}},
    "x-reef-release-id": {"description": "Release serving the scenario when the request started "
                                         "(absent before the scenario's first release).",
                          "schema": {"type": "string"}},
}


def _body_schema(required: list[str], props: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": required, "properties": props, "additionalProperties": True}}}}}


_MESSAGES = {"type": "array", "items": {"type": "object"}, "minItems": 1}
OPENAI_BODY = _body_schema(["messages"], {
    "model": {"type": "string"}, "messages": _MESSAGES, "stream": {"type": "boolean"},
    "max_tokens": {"type": "integer"}, "max_completion_tokens": {"type": "integer"},
    "temperature": {"type": "number"}, "top_p": {"type": "number"},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "tools": {"type": "array", "items": {"type": "object"}}, "tool_choice": {},
    "stream_options": {"type": "object"},
})
ANTHROPIC_BODY = _body_schema(["messages", "max_tokens"], {
    "model": {"type": "string"}, "messages": _MESSAGES, "max_tokens": {"type": "integer", "minimum": 1},
    "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    "stream": {"type": "boolean"}, "temperature": {"type": "number"}, "top_p": {"type": "number"},
    "stop_sequences": {"type": "array", "items": {"type": "string"}},
    "tools": {"type": "array", "items": {"type": "object"}}, "tool_choice": {"type": "object"},
})
#: the Responses body as Reef reads it (every body is checked against it: ``_check_responses``)
RESPONSES_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": RESPONSES_REQUEST}}}}
_RESPONSES = {
    200: {"description": "The provider's response body (JSON), or an SSE stream when `stream` is true.",
          "headers": _REEF_HEADERS_DOC,
          "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}}},
    400: {"description": "Malformed request (provider-shaped error)."},
    401: {"description": "Missing or invalid token."},
    403: {"description": "Token lacks the `infer` role or the scenario, or the scenario cannot be created "
                         "(`server.max_scenarios`, `server.scenarios_open`)."},
    404: {"description": "`model` is neither served nor a `runtime.model_aliases` name (`model_not_found`)."},
    413: {"description": "Body larger than `server.max_body_bytes` (on `/v1/responses`, counting the conversation "
                         "`previous_response_id` continues)."},
    502: {"description": "Upstream unreachable; upstream errors keep their own status."},
}


def _request_meta(request: Request, default_scenario: str) -> tuple[str, str | None, dict[str, str] | None]:
    """(scenario, session, tags) from the ``x-reef-*`` headers, in one pass over raw headers."""
    scenario = None
    session = None
    tags: dict[str, str] | None = None
    for raw_name, raw_value in request.scope["headers"]:
        if not raw_name.startswith(b"x-reef-"):
            continue
        name = raw_name.decode("latin-1")
        value = raw_value.decode("latin-1").strip()
        if name == "x-reef-scenario":
            scenario = value
        elif name == "x-reef-session":
            session = value[:200] or None
        elif name.startswith(_TAG_PREFIX) and len(name) > len(_TAG_PREFIX):
            tags = tags if tags is not None else {}
            if len(tags) >= _MAX_TAGS:
                raise ClientError(f"too many x-reef-tag-* headers (at most {_MAX_TAGS})")
            tags[name[len(_TAG_PREFIX):]] = value[:1000]
    return header_scenario(scenario, default_scenario), session, tags


def parse_json_object(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The request body as a JSON object no deeper than ``max_depth`` (``server.max_json_depth``),
    or a 400 naming what is wrong. The depth bound is what keeps every stored body readable
    back and re-encodable for the upstream (encoders stop near 255 levels)."""
    if not raw:
        raise ClientError("the request body is empty; send a JSON object")
    try:
        body = jsonfast.loads(raw)
    except ValueError as exc:
        if "depth" in str(exc) or "recursion" in str(exc):
            raise too_deep(max_depth) from None
        raise ClientError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:  # the standard library parser (no orjson installed)
        raise too_deep(max_depth) from None
    if not isinstance(body, dict):
        raise ClientError("the request body must be a JSON object")
    if jsonfast.nesting_depth(body, max_depth) > max_depth:
        raise too_deep(max_depth)
    return body


def too_deep(max_depth: int) -> ClientError:
    return ClientError(f"the request body nests objects and arrays more than {max_depth} levels deep "
                       f"(server.max_json_depth)")


def _check_common(body: dict[str, Any]) -> bool:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ClientError("messages: a non-empty array of messages is required", param="messages")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ClientError("model: must be a string", param="model")
    streamed = body.get("stream", False)
    if streamed is not None and not isinstance(streamed, bool):
        raise ClientError("stream: must be a boolean", param="stream")
    return bool(streamed)


def _check_responses(body: dict[str, Any]) -> bool:
    if "input" not in body:
        raise ClientError("input: a string or an array of input items is required", param="input")
    mt = body.get("max_output_tokens")
    if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
        raise ClientError("max_output_tokens: must be a positive integer", param="max_output_tokens")
    check_types(body)  # every field of the wrong type, at any depth, before anything reads the body
    return bool(body.get("stream"))


async def _with_previous(state: ServeState, scenario: str, body: dict[str, Any], sent: int) -> dict[str, Any]:
    """A Responses body whose ``previous_response_id`` names one of this scenario's stored
    responses: that request's input and that answer's output become the prefix of ``input``
    (what is recorded and sent). Instructions are not carried over, as OpenAI does. Before a
    Responses upstream an id that is no receipt is the provider's: it goes through as sent
    (``responses_native``).

    The continued request, prefix included, obeys ``server.max_body_bytes`` like a body sent
    whole (``sent`` bytes came on the wire): otherwise each turn of a chain would store and send
    a larger request than any client may, without end."""
    previous = body.get("previous_response_id")
    if not previous:
        return body
    record = await run_in_threadpool(state.reef.store.get_record, previous)
    native = is_native(state)
    if native and record is None:
        return body  # the provider's own stored response: the upstream follows it
    stored = record is not None and record.scenario == scenario and record.route == "openai.responses" \
        and record.status == "ok" and isinstance(record.request, dict) and isinstance(record.response, dict)
    if not stored:
        raise ClientError(f"previous_response_id: no stored response {previous!r} in scenario {scenario!r} "
                          f"(only answered /v1/responses requests of the same scenario can be continued)",
                          param="previous_response_id")
    if record.request.get("store") is False:
        raise ClientError(f"previous_response_id: response {previous!r} was created with store: false, so it "
                          f"cannot be continued; send the whole conversation as input",
                          param="previous_response_id")
    as_input = output_items_as_input if native else output_as_input
    prefix = input_items(record.request.get("input"), "previous input") + as_input(record.response.get("output"))
    size = sent + len(jsonfast.dumps(prefix))
    if size > state.max_body_bytes:
        raise ClientError(f"previous_response_id: the conversation it continues and this request come to about "
                          f"{size} bytes, more than the server's limit of {state.max_body_bytes} bytes "
                          f"(server.max_body_bytes), which a continued request obeys like a whole one; start a "
                          f"new conversation with a shorter input", 413, param="previous_response_id")
    expanded = {**body, "input": prefix + input_items(body["input"])}
    if native:  # the upstream gets the whole conversation instead of an id it never saw
        del expanded["previous_response_id"]
    return expanded


async def _serve(request: Request, principal: Principal, dialect: str, route: str) -> Response:
    state: ServeState = request.app.state.serve
    scenario, session, tags = _request_meta(request, state.default_scenario)
    check_scenario(principal, scenario)
    raw = await request.body()
    body = parse_json_object(raw, state.max_json_depth)
    if dialect == "responses":
        streamed = _check_responses(body)
        body = await _with_previous(state, scenario, body, len(raw))
    else:
        streamed = _check_common(body)
    if dialect == "anthropic":
        mt = body.get("max_tokens")
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise ClientError("max_tokens: a positive integer is required", param="max_tokens")
    reef = state.reef
    body = reef.resolve_model(body)  # an alias becomes the served name; an unserved name is 404 model_not_found
    release = reef.serving_release(scenario)  # frozen for the whole request
    # a client that installed this very release (an agent's instructions file) already sends it
    if release is not None and request.headers.get(INSTALLED_HEADER, "").strip() == release.release_id:
        prepared = body
    else:
        prepared = reef.prepare_body(scenario, body, dialect, release)
    state.scenarios.admit(scenario)  # 403 past server.max_scenarios, or when closed (server.scenarios_open)
    ex = Exchange(route=route, dialect=dialect, scenario=scenario, session=session, tags=tags,
                  record_id=new_id("rec"), release=release, body=prepared, stream=streamed,
                  max_json_depth=state.max_json_depth)
    return await (stream(state, ex) if streamed else complete(state, ex, request.receive))


@router.post("/v1/chat/completions", openapi_extra=OPENAI_BODY, responses=_RESPONSES,
             summary="OpenAI Chat Completions (streaming and non-streaming)")
async def chat_completions(request: Request, principal: Principal = _infer) -> Response:
    """An OpenAI Chat Completions request, served by the runtime (translated if it speaks
    Anthropic) and recorded; the receipt is in ``x-reef-agent-record-id``."""
    return await _serve(request, principal, "openai", "openai.chat")


@router.post("/v1/messages", openapi_extra=ANTHROPIC_BODY, responses=_RESPONSES,
             summary="Anthropic Messages (streaming and non-streaming)")
async def messages(request: Request, principal: Principal = _infer) -> Response:
    """An Anthropic Messages request, served by the runtime (translated if it speaks OpenAI)
    and recorded; the receipt is in ``x-reef-agent-record-id``."""
    return await _serve(request, principal, "anthropic", "anthropic.messages")


@router.post("/v1/responses", openapi_extra=RESPONSES_BODY, responses=_RESPONSES,
             summary="OpenAI Responses (streaming and non-streaming)")
async def responses(request: Request, principal: Principal = _infer) -> Response:
    """An OpenAI Responses request, served by the runtime through Chat Completions (translated
    further if it speaks Anthropic) and recorded; the receipt is in ``x-reef-agent-record-id`` and
    is also the response's ``id``, which ``previous_response_id`` continues. Before a Responses
    upstream (``runtime.dialect: responses``) the body goes as it came and the answer comes back
    as the upstream gave it (its own ``id``); the receipt is the header and, streamed, the final
    event's ``reef``."""
    return await _serve(request, principal, "responses", "openai.responses")


@router.get("/v1/responses/{response_id}", summary="A stored OpenAI Responses answer",
            responses={200: {"description": "The response object, as `POST /v1/responses` answered it."},
                       404: {"description": "No retrievable response with this id in the scenario."}})
async def retrieve_response(response_id: str, request: Request, principal: Principal = _infer) -> Response:
    """What a ``/v1/responses`` request of this scenario was answered with, by its ``id`` (the
    receipt), as OpenAI's ``GET /v1/responses/{id}`` returns it: ``completed``, or
    ``incomplete`` for a stream that was cut. Like ``previous_response_id`` it reads only the
    request's scenario (``x-reef-scenario``); a response created with ``store: false``, one of
    another route or scenario, and one that failed before answering are 404s. Before a Responses
    upstream (``runtime.dialect: responses``) an id that is no receipt is asked of the upstream."""
    state: ServeState = request.app.state.serve
    scenario, _, _ = _request_meta(request, state.default_scenario)
    check_scenario(principal, scenario)
    if request.query_params.get("stream") in ("true", "1"):
        raise ClientError("stream: replaying a stored response as events is not supported; retrieve it without "
                          "stream", param="stream")
    # The answer and whether the request said ``store: false``: the request's body (the whole conversation)
    # stays unread.
    record = await run_in_threadpool(state.reef.store.stored_response, response_id)
    if record is None and is_native(state):
        return await retrieve_upstream(state, response_id)  # a response the provider stored
    found = record is not None and record.scenario == scenario and record.route == "openai.responses" \
        and isinstance(record.response, dict) and record.response.get("object") == "response"
    if not found:
        raise NotFoundError(f"no stored response {response_id!r} in scenario {scenario!r}")
    if record.unstored:
        raise NotFoundError(f"response {response_id!r} was created with store: false, so it cannot be retrieved")
    return Response(jsonfast.dumps(record.response), media_type="application/json",
                    headers={"x-reef-agent-record-id": record.id})


@router.get("/v1/models", summary="Models served (OpenAI list shape; Anthropic shape with anthropic-version)")
async def list_models(request: Request, principal: Principal = _infer) -> Response:
    """The served model ids, then ``runtime.model_aliases``. Clients sending ``anthropic-version`` get
    Anthropic's list shape."""
    state: ServeState = request.app.state.serve
    names = state.reef.model_names()
    if "anthropic-version" in request.headers:
        data = [{"type": "model", "id": n, "display_name": n, "created_at": "1970-01-01T00:00:00Z"} for n in names]
        body: dict[str, Any] = {"data": data, "has_more": False, "first_id": names[0] if names else None,
                                "last_id": names[-1] if names else None}
    else:
        now = int(time.time())
        body = {"object": "list", "data": [{"id": n, "object": "model", "created": now, "owned_by": "reef"}
                                           for n in names]}
    return Response(jsonfast.dumps(body), media_type="application/json")
