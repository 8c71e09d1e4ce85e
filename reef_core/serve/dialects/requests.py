"""Request bodies: OpenAI Chat Completions ⇄ Anthropic Messages."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .. import jsonfast
from ..errors import ClientError

#: max_tokens sent to an Anthropic upstream when an OpenAI client set none (Anthropic requires it)
DEFAULT_MAX_TOKENS = 4096


def translate_request(body: dict[str, Any], source: str, target: str, *,
                      default_max_tokens: int = DEFAULT_MAX_TOKENS) -> dict[str, Any]:
    """``body`` (in ``source`` dialect) as a ``target`` dialect request body."""
    if source == target:
        return body
    if (source, target) not in (("openai", "anthropic"), ("anthropic", "openai")):
        raise ValueError(f"cannot translate requests from {source!r} to {target!r}")
    with client_shape(source, target):
        if source == "openai":
            return openai_to_anthropic(body, default_max_tokens=default_max_tokens)
        return anthropic_to_openai(body)


@contextmanager
def client_shape(source: str, target: str, fields: str = "messages, tools and tool_choice") -> Iterator[None]:
    """Translation of a client's ``source`` body for a ``target`` upstream: a field of the wrong
    shape somewhere deep (tool_calls that is a string, a tool type that is a list) is the
    client's mistake, answered as a 400 naming what to check, never a crash of the translator."""
    try:
        yield
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        raise ClientError(f"the request body does not have the {source} shape Reef can translate "
                          f"for a {target} upstream ({type(exc).__name__}: {exc}); check {fields}") from None


# ---------------------------------------------------------------------------- helpers


def _text_of(content: Any) -> str:
    """Plain text of an OpenAI or Anthropic content value (string or list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(p.get("text", "")))
        return "\n".join(parts)
    return str(content)


def _parse_arguments(arguments: Any) -> dict[str, Any]:
    """OpenAI tool-call arguments (a JSON string) as an Anthropic ``input`` object."""
    if isinstance(arguments, dict):
        return arguments
    if not arguments:
        return {}
    try:
        value = jsonfast.loads(arguments)
    except ValueError:
        raise ClientError(f"tool call arguments are not valid JSON: {str(arguments)[:200]!r}") from None
    return value if isinstance(value, dict) else {"value": value}


def _dump_arguments(value: Any) -> str:
    return jsonfast.dumps(value if value is not None else {}).decode()


# ---------------------------------------------------------------------------- OpenAI -> Anthropic


def _data_url(url: str) -> tuple[str, str] | None:
    """(media type, base64 data) of a ``data:<media>;base64,<data>`` URL, else None."""
    if url.startswith("data:") and ";base64," in url:
        media, data = url[5:].split(";base64,", 1)
        return media, data
    return None


def _openai_file_to_document(part: dict[str, Any], param: str) -> dict[str, Any]:
    """A Chat Completions ``file`` part (a PDF sent inline) as an Anthropic ``document`` block."""
    file = part.get("file")
    data = _data_url(file.get("file_data") or "") if isinstance(file, dict) and \
        isinstance(file.get("file_data"), str) else None
    if data is None:
        raise ClientError(f"{param}: a file part needs its file_data as a base64 data URL before an Anthropic "
                          f"upstream (a file_id names a file of OpenAI's, which Anthropic cannot read)", param=param)
    media, payload = data
    if media != "application/pdf":
        raise ClientError(f"{param}: a file of type {media!r} cannot be sent to an Anthropic upstream "
                          f"(documents are PDFs)", param=param)
    block: dict[str, Any] = {"type": "document", "source": {"type": "base64", "media_type": media, "data": payload}}
    if file.get("filename"):
        block["title"] = str(file["filename"])
    return block


def _openai_part_to_block(part: Any, param: str) -> dict[str, Any] | None:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind == "refusal":  # an assistant's refusal, as it said it
        return {"type": "text", "text": str(part.get("refusal", ""))}
    if kind == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str):
            return None
        data = _data_url(url)
        if data:
            return {"type": "image", "source": {"type": "base64", "media_type": data[0], "data": data[1]}}
        return {"type": "image", "source": {"type": "url", "url": url}}
    if kind == "file":
        return _openai_file_to_document(part, param)
    raise ClientError(f"{param}: content of type {kind!r} cannot be sent to an Anthropic upstream "
                      f"(send text, image_url or a PDF file)", param=param)


def _openai_content_blocks(content: Any, param: str) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return [b for b in (_openai_part_to_block(p, f"{param}.{j}") for j, p in enumerate(content)) if b is not None]
    return [{"type": "text", "text": str(content)}]


def openai_to_anthropic(body: dict[str, Any], *, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> dict[str, Any]:
    if (body.get("n") or 1) > 1:
        raise ClientError("n > 1 is not supported when the upstream speaks the Anthropic dialect", param="n")
    if body.get("logprobs") or body.get("top_logprobs"):  # the answer would come back without them
        key = "logprobs" if body.get("logprobs") else "top_logprobs"
        raise ClientError(f"{key}: the upstream speaks the Anthropic dialect, which returns no logprobs; leave "
                          f"{key} out", param=key)
    system: list[str] = []
    messages: list[dict[str, Any]] = []

    def append(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:  # Anthropic wants roles to alternate
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for i, m in enumerate(body.get("messages") or []):
        if not isinstance(m, dict):
            raise ClientError(f"messages[{i}] must be an object", param=f"messages.{i}")
        role = m.get("role")
        if role in ("system", "developer"):
            text = _text_of(m.get("content"))
            if text:
                system.append(text)
        elif role == "user":
            append("user", _openai_content_blocks(m.get("content"), f"messages.{i}.content"))
        elif role == "assistant":
            blocks = _openai_content_blocks(m.get("content"), f"messages.{i}.content")
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                blocks.append({"type": "tool_use", "id": tc.get("id") or f"toolu_{i}",
                               "name": fn.get("name", ""), "input": _parse_arguments(fn.get("arguments"))})
            fc = m.get("function_call")
            if isinstance(fc, dict):
                blocks.append({"type": "tool_use", "id": f"toolu_fc_{i}", "name": fc.get("name", ""),
                               "input": _parse_arguments(fc.get("arguments"))})
            append("assistant", blocks)
        elif role in ("tool", "function"):
            content = m.get("content")
            result: Any = content if isinstance(content, str) else \
                _openai_content_blocks(content, f"messages.{i}.content")
            append("user", [{"type": "tool_result", "tool_use_id": m.get("tool_call_id") or m.get("name", ""),
                             "content": result}])
        else:
            raise ClientError(f"messages[{i}].role {role!r} is not one of system, developer, user, "
                              f"assistant, tool", param=f"messages.{i}.role")

    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if system:
        out["system"] = "\n\n".join(system)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
    out["max_tokens"] = max_tokens
    for key in ("temperature", "top_p", "stream"):
        if body.get(key) is not None:
            out[key] = body[key]
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    tools = body.get("tools")
    if tools:
        out["tools"] = []
        for k, t in enumerate(tools):
            fn = t.get("function")
            if t.get("type", "function") != "function" or not isinstance(fn, dict):
                raise ClientError(f"tools[{k}]: only function tools can be sent to an Anthropic upstream (this one is "
                                  f"of type {t.get('type')!r})", param=f"tools.{k}")
            schema = fn.get("parameters") or {"type": "object", "properties": {}}
            tool = {"name": fn.get("name", ""), "input_schema": schema}
            if fn.get("description"):
                tool["description"] = fn["description"]
            out["tools"].append(tool)
    choice = body.get("tool_choice")
    tc_out: dict[str, Any] | None = None
    if choice == "auto":
        tc_out = {"type": "auto"}
    elif choice == "none":
        tc_out = {"type": "none"}
    elif choice == "required":
        tc_out = {"type": "any"}
    elif isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name:
            tc_out = {"type": "tool", "name": name}
    if body.get("parallel_tool_calls") is False and tools:
        tc_out = tc_out or {"type": "auto"}
        if tc_out["type"] != "none":
            tc_out["disable_parallel_tool_use"] = True
    if tc_out and tools:
        out["tool_choice"] = tc_out
    if body.get("user"):
        out["metadata"] = {"user_id": str(body["user"])}
    output_config = _anthropic_output_config(body)
    if output_config:
        out["output_config"] = output_config
    return out


def _anthropic_output_config(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI body's ``response_format`` as Anthropic's ``output_config.format`` (structured
    outputs with a JSON schema). What Anthropic cannot express (a JSON object without a schema) is a
    400 naming the field.

    A reasoning effort does not cross between OpenAI and Anthropic (here or in
    ``_openai_output_fields``): each accepts one only for some of its models (OpenAI refuses
    ``reasoning_effort`` on gpt-4o, Anthropic ``output_config.effort`` on models without it), and an
    agent such as Codex sends one with every turn, so a faithful copy would turn a working setup
    into the upstream's 400. It is a hint about thoroughness, not about what the answer must be,
    so it is left out (docs/serving.md says so)."""
    config: dict[str, Any] = {}
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else fmt
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ClientError("response_format.json_schema.schema: a JSON schema object is required",
                              param="response_format.json_schema.schema")
        config["format"] = {"type": "json_schema", "schema": schema}
    elif kind == "json_object":
        raise ClientError("response_format: json_object has no counterpart in the Anthropic Messages API the "
                          "upstream speaks; send a json_schema response_format (structured outputs) instead",
                          param="response_format")
    elif fmt is not None and kind != "text":
        raise ClientError(f"response_format: type {kind!r} is not one of text, json_schema, json_object",
                          param="response_format")
    return config


def _openai_output_fields(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic body's ``output_config`` (and the beta's top-level ``output_format``) as OpenAI's
    ``response_format`` (a JSON schema, not strict: Anthropic does not ask a schema to meet OpenAI's
    strict-mode rules)."""
    out: dict[str, Any] = {}
    config = body.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise ClientError("output_config: must be an object", param="output_config")
    fmt, param = (config or {}).get("format"), "output_config.format"
    if fmt is None:
        fmt, param = body.get("output_format"), "output_format"
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise ClientError(f"{param}: must be {{type: json_schema, schema: {{...}}}}", param=param)
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    return out


# ---------------------------------------------------------------------------- Anthropic -> OpenAI


def _anthropic_block_to_part(block: Any, param: str) -> dict[str, Any] | None:
    if isinstance(block, str):
        return {"type": "text", "text": block}
    if not isinstance(block, dict):
        return None
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": str(block.get("text", ""))}
    if kind == "image":
        src = block.get("source") or {}
        if src.get("type") == "base64":
            return {"type": "image_url",
                    "image_url": {"url": f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"}}
        if src.get("type") == "url":
            return {"type": "image_url", "image_url": {"url": src.get("url", "")}}
        raise ClientError(f"{param}: an image of source type {src.get('type')!r} cannot be sent to an OpenAI-style "
                          f"upstream (send it base64 or by URL)", param=f"{param}.source")
    if kind == "document":
        return _anthropic_document_to_part(block, param)
    return None


def _anthropic_document_to_part(block: dict[str, Any], param: str) -> dict[str, Any]:
    """An Anthropic ``document`` block as a Chat Completions part: a PDF as a ``file`` part with its
    data inline, a plain-text document (or one given as content blocks) as text under its title."""
    src = block.get("source") or {}
    kind = src.get("type")
    title = block.get("title")
    if kind == "base64" and src.get("media_type", "application/pdf") == "application/pdf":
        return {"type": "file", "file": {"filename": str(title or "document.pdf"),
                                         "file_data": f"data:application/pdf;base64,{src.get('data', '')}"}}
    if kind in ("text", "content"):
        text = str(src.get("data", "")) if kind == "text" else _text_of(src.get("content"))
        return {"type": "text", "text": f"{title}\n\n{text}" if title else text}
    raise ClientError(f"{param}: a document of source type {kind!r} cannot be sent to an OpenAI-style upstream "
                      f"(send a base64 PDF or text)", param=f"{param}.source")


def tool_result_media(call_id: str, media: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat Completions user parts carrying what a tool's result held besides text (its images,
    documents): a ``tool`` message holds text only, so they follow the turn's tool messages in a
    user message, introduced by the call they belong to."""
    return [{"type": "text", "text": f"(attached to the result of tool call {call_id}:)"}, *media]


def _openai_content(parts: list[dict[str, Any]]) -> Any:
    """Collapse all-text parts to one string (what every OpenAI-compatible server accepts)."""
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def anthropic_to_openai(body: dict[str, Any]) -> dict[str, Any]:
    turns = body.get("messages")
    if isinstance(turns, list) and turns and isinstance(turns[-1], dict) and turns[-1].get("role") == "assistant":
        # a prefill: Anthropic continues it; an OpenAI-style model answers a new turn after it instead
        last = len(turns) - 1
        raise ClientError(f"messages.{last}: the conversation ends with an assistant message (a prefill), which "
                          f"the upstream, speaking the OpenAI dialect, does not continue; end with a user message",
                          param=f"messages.{last}")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(system)})
    for i, m in enumerate(body.get("messages") or []):
        if not isinstance(m, dict):
            raise ClientError(f"messages.{i}: must be an object", param=f"messages.{i}")
        role = m.get("role")
        content = m.get("content")
        if role == "system":  # mid-conversation system messages (Claude Code 2.1 sends them)
            text = _text_of(content)
            if text:
                messages.append({"role": "system", "content": text})
            continue
        if role not in ("user", "assistant"):
            raise ClientError(f"messages.{i}.role: {role!r} is not one of user, assistant, system",
                              param=f"messages.{i}.role")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        if role == "assistant":
            parts: list[dict[str, Any]] = []
            tool_calls = []
            for b in blocks:
                if isinstance(b, dict) and b.get("type") == "tool_use":
                    tool_calls.append({"id": b.get("id", ""), "type": "function",
                                       "function": {"name": b.get("name", ""),
                                                    "arguments": _dump_arguments(b.get("input"))}})
                elif isinstance(b, dict) and b.get("type") == "text":
                    parts.append({"type": "text", "text": str(b.get("text", ""))})
            msg: dict[str, Any] = {"role": "assistant",
                                   "content": _openai_content(parts) if parts else None}
            if tool_calls:
                msg["tool_calls"] = tool_calls
            messages.append(msg)
            continue
        # user: tool results become `tool` messages, which OpenAI wants right after the call
        parts = []
        for j, b in enumerate(blocks):
            if isinstance(b, dict) and b.get("type") == "tool_result":
                result = b.get("content")
                text = _text_of(result) if not isinstance(result, str) else result
                if b.get("is_error"):
                    text = f"[tool error] {text}"
                call_id = b.get("tool_use_id", "")
                messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
                # a tool message holds text only: the result's images (and documents) follow in the
                # user message after the tool messages (the screenshot an agent's tool took)
                media = [p for p in (_anthropic_block_to_part(r, f"messages.{i}.content.{j}.content.{k}")
                                     for k, r in enumerate(result) if isinstance(r, dict) and r.get("type") != "text")
                         if p is not None] if isinstance(result, list) else []
                if media:
                    parts += tool_result_media(call_id, media)
            else:
                p = _anthropic_block_to_part(b, f"messages.{i}.content.{j}")
                if p is not None:
                    parts.append(p)
        if parts:
            messages.append({"role": "user", "content": _openai_content(parts)})

    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("max_tokens") is not None:
        out["max_tokens"] = body["max_tokens"]
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    tools = body.get("tools") or []
    for k, t in enumerate(tools):
        if isinstance(t, dict) and "input_schema" not in t:  # a server tool (web search, code execution, …)
            raise ClientError(f"tools.{k}.type: the Anthropic tool {t.get('type') or t.get('name')!r} is run by "
                              f"Anthropic's own service, and the upstream speaks the OpenAI dialect; declare a "
                              f"custom tool (with an input_schema) your client runs", param=f"tools.{k}.type")
    tools = [t for t in tools if isinstance(t, dict)]
    if tools:
        out["tools"] = []
        for t in tools:
            fn = {"name": t.get("name", ""), "parameters": t.get("input_schema") or {"type": "object"}}
            if t.get("description"):
                fn["description"] = t["description"]
            out["tools"].append({"type": "function", "function": fn})
        choice = body.get("tool_choice") or {}
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "auto":
            out["tool_choice"] = "auto"
        elif kind == "any":
            out["tool_choice"] = "required"
        elif kind == "none":
            out["tool_choice"] = "none"
        elif kind == "tool":
            out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name", "")}}
        if isinstance(choice, dict) and choice.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    user = (body.get("metadata") or {}).get("user_id") if isinstance(body.get("metadata"), dict) else None
    if user:
        out["user"] = str(user)
    out.update(_openai_output_fields(body))
    return out
