"""``/v1/responses`` before a Responses upstream (``runtime.dialect: responses``): what differs
from the translated mode besides the body going through as it came (``dialects.translate_*``).

- ``previous_response_id`` naming one of Reef's receipts is expanded from the record, as in the
  translated mode, but the stored answer's output items go on as the provider gave them
  (reasoning with its ``encrypted_content``, custom and hosted tool calls): the upstream takes
  them back as input. Any other id is the provider's own stored response: it goes upstream as
  sent, and the record keeps the request as sent.
- ``GET /v1/responses/{id}`` of an id that is no receipt asks the upstream (a response the
  provider stored). The provider's response ids are capabilities there as at the provider:
  Reef's scenarios do not reach into what the provider stores under its API key.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from ..errors import RuntimeCallError
from . import jsonfast
from .dialects.responses_api import output_as_input
from .errors import upstream_error_response
from .state import ServeState

#: the runtime dialect this module serves
DIALECT = "responses"


def is_native(state: ServeState) -> bool:
    """Whether ``/v1/responses`` bodies go to the upstream as they came."""
    return state.runtime_dialect == DIALECT


def output_items_as_input(output: Any) -> list[dict[str, Any]]:
    """A stored answer's ``output`` as input items of the next turn, for a Responses upstream:
    messages and function calls as in the translated mode (``output_as_input``), every other
    item (reasoning, custom tool calls, hosted tool calls) as the provider gave it."""
    items: list[dict[str, Any]] = []
    for item in output or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") in ("message", "function_call"):
            items += output_as_input([item])
        else:
            items.append(item)
    return items


async def retrieve_upstream(state: ServeState, response_id: str) -> Response:
    """The provider's stored response ``response_id``, as the upstream answers it (its error,
    status included, in the Responses shape when it fails)."""
    try:
        body = await state.reef.runtime.retrieve(response_id)
    except RuntimeCallError as exc:
        return upstream_error_response(DIALECT, DIALECT, exc)
    return Response(jsonfast.dumps(body), media_type="application/json")
