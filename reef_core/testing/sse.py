"""Reading server-sent events in tests."""

from __future__ import annotations

import json
from typing import Any


def parse_sse(text: str) -> list[tuple[str | None, Any]]:
    """``(event name or None, data)`` per event; data is parsed JSON, or the raw string
    (e.g. ``[DONE]``) when it is not JSON."""
    out: list[tuple[str | None, Any]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if not data:
            continue
        raw = "\n".join(data)
        try:
            out.append((name, json.loads(raw)))
        except ValueError:
            out.append((name, raw))
    return out
