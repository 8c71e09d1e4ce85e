"""Output items of the OpenAI Responses API, shaped as the service returns them, for
``FakeResponsesUpstream`` responders. Ids are generated; ``encrypted_content`` of a reasoning
item is an opaque string that names the item, so a test can check it came back unchanged."""

from __future__ import annotations

import itertools
import json
from typing import Any

_ids = itertools.count(1)


def _id(prefix: str) -> str:
    return f"{prefix}_fake{next(_ids):04d}"


def message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": _id("msg"), "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def reasoning(summary: str = "") -> dict[str, Any]:
    """A reasoning item as a ``store: false`` client gets it (``include: ["reasoning.encrypted_content"]``)."""
    item_id = _id("rs")
    return {"type": "reasoning", "id": item_id,
            "summary": [{"type": "summary_text", "text": summary}] if summary else [],
            "encrypted_content": f"gAAAA-encrypted-{item_id}-" + "x" * 64}


def function_call(name: str, arguments: dict[str, Any] | str, *, call_id: str = "") -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function_call", "id": _id("fc"), "call_id": call_id or _id("call"), "name": name,
            "arguments": args, "status": "completed"}


def custom_tool_call(name: str, text: str, *, call_id: str = "") -> dict[str, Any]:
    """A call of a ``custom`` (free-form) tool: its input is plain text (Codex's ``apply_patch``)."""
    return {"type": "custom_tool_call", "id": _id("ctc"), "call_id": call_id or _id("call"), "name": name,
            "input": text, "status": "completed"}


def web_search(query: str) -> dict[str, Any]:
    """A hosted ``web_search`` call the provider ran itself."""
    return {"type": "web_search_call", "id": _id("ws"), "status": "completed",
            "action": {"type": "search", "query": query, "sources": []}}
