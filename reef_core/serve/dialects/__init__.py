"""Translation between the OpenAI Chat Completions and Anthropic Messages dialects.

The server speaks whatever dialect the client used and the runtime speaks its own; these
modules translate request bodies client→runtime and responses (whole or streamed)
runtime→client. Translation is lossless for what both dialects can express — messages,
system prompts, images, tool definitions, tool choice, tool calls and results, stop
reasons, usage — and drops what one side cannot express (e.g. Anthropic ``thinking``
blocks for an OpenAI client, ``logit_bias`` for an Anthropic upstream).
"""

from __future__ import annotations

from .requests import translate_request
from .responses import translate_response, usage_summary
from .streams import StreamAssembler, is_usage_chunk, stream_translator

DIALECTS = ("openai", "anthropic")

__all__ = [
    "DIALECTS",
    "StreamAssembler",
    "is_usage_chunk",
    "stream_translator",
    "translate_request",
    "translate_response",
    "usage_summary",
]
