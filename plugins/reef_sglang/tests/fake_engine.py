"""A fake SGLang / vLLM server implementing the documented wire protocol the runtime uses.

Chat answers are deterministic: ``"<adapter or base>: <last user message>"``, one token per
character (token id = code point, logprob = -0.01 × position). Adapter selection follows
each engine: SGLang reads ``lora_path`` from the body (or ``model: "base:adapter"``), vLLM
reads the adapter name from ``model``. Unknown adapters are 400s, as the engines answer.
A message ``"hold"`` waits on ``engine.gate`` (a threading.Event) so tests can keep a
request in flight without timing.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

BASE = "fake/base-model"


class FakeEngine:
    def __init__(self, flavor: str):
        self.flavor = flavor
        self.loaded: dict[str, str] = {}
        self.calls: list[tuple[str, dict]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.holding = threading.Event()
        #: adapter loads wait on it (set: they do not); ``loading`` is set when one waits
        self.load_gate = threading.Event()
        self.load_gate.set()
        self.loading = threading.Event()
        #: a message for every adapter load (the engine answers 500), e.g. out of GPU memory
        self.refuse_loads: str | None = None
        self.model = BASE
        self.app = self._build()

    def _adapter(self, body: dict) -> tuple[str | None, str | None]:
        """(adapter, error) for a chat body."""
        if self.flavor == "sglang":
            name = body.get("lora_path")
            model = body.get("model", self.model)
            if name is None and ":" in model:
                model, name = model.split(":", 1)
            if model != self.model:
                return None, f"model {model!r} not found"
        else:
            model = body.get("model", self.model)
            name = None if model == self.model else model
        if name is not None and name not in self.loaded:
            return None, f"LoRA adapter {name!r} is not loaded"
        return name, None

    def _build(self) -> FastAPI:
        app = FastAPI()
        prefix = "" if self.flavor == "sglang" else "/v1"

        @app.get("/v1/models")
        async def models():
            data = [{"id": self.model, "object": "model"}]
            if self.flavor == "vllm":
                data += [{"id": n, "object": "model", "parent": self.model} for n in self.loaded]
            return {"object": "list", "data": data}

        @app.post(prefix + "/load_lora_adapter")
        async def load(req: Request):
            body = await req.json()
            self.calls.append(("load", body))
            if not self.load_gate.is_set():
                self.loading.set()
                await asyncio.to_thread(self.load_gate.wait, 30)
            if self.refuse_loads:
                return JSONResponse({"message": self.refuse_loads}, status_code=500)
            path = Path(body.get("lora_path", ""))
            if not (path / "adapter_config.json").is_file():
                return JSONResponse({"message": f"no adapter at {path}"}, status_code=400)
            if body["lora_name"] in self.loaded:
                return JSONResponse({"message": f"{body['lora_name']} already loaded"}, status_code=400)
            self.loaded[body["lora_name"]] = str(path)
            return {"success": True, "loaded_adapters": dict(self.loaded)}

        @app.post(prefix + "/unload_lora_adapter")
        async def unload(req: Request):
            body = await req.json()
            self.calls.append(("unload", body))
            if self.loaded.pop(body["lora_name"], None) is None:
                return JSONResponse({"message": f"{body['lora_name']} not loaded"}, status_code=400)
            return {"success": True}

        @app.post("/v1/chat/completions")
        async def chat(req: Request):
            body = await req.json()
            self.calls.append(("chat", body))
            adapter, error = self._adapter(body)
            if error:
                return JSONResponse(
                    {"object": "error", "message": error, "type": "BadRequestError", "code": 400}, status_code=400
                )
            user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
            if user == "hold":
                self.holding.set()
                await asyncio.to_thread(self.gate.wait, 30)
            text = f"{adapter or 'base'}: {user}"
            tokens = [ord(c) for c in text]
            prompt = [ord(c) for c in user]
            lps = [-0.01 * i for i in range(len(tokens))]
            model = body.get("model", self.model)
            if body.get("stream"):
                return StreamingResponse(self._sse(body, text, tokens, prompt, lps, model), media_type="text/event-stream")
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "logprobs": {
                    "content": [{"token": c, "logprob": lp, "bytes": [ord(c)], "top_logprobs": []} for c, lp in zip(text, lps)]
                }
                if body.get("logprobs")
                else None,
            }
            out = {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(tokens),
                    "total_tokens": len(prompt) + len(tokens),
                },
            }
            if body.get("return_token_ids"):
                choice["token_ids"] = tokens
                if self.flavor == "sglang":
                    choice["prompt_token_ids"] = prompt
                else:
                    out["prompt_token_ids"] = prompt
            return out

        return app

    async def _sse(self, body, text, tokens, prompt, lps, model):
        for i, (c, tok, lp) in enumerate(zip(text, tokens, lps)):
            choice = {
                "index": 0,
                "delta": {"content": c} if i else {"role": "assistant", "content": c},
                "finish_reason": None,
                "logprobs": {"content": [{"token": c, "logprob": lp, "bytes": [tok], "top_logprobs": []}]}
                if body.get("logprobs")
                else None,
            }
            event = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [choice]}
            if body.get("return_token_ids") and self.flavor == "vllm":
                choice["token_ids"] = [tok]
                if i == 0:
                    event["prompt_token_ids"] = prompt
            yield f"data: {json.dumps(event)}\n\n"
        final = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": None}],
        }
        yield f"data: {json.dumps(final)}\n\n"
        yield "data: [DONE]\n\n"


class ServerThread:
    """Run an ASGI app with uvicorn on a free loopback port in a background thread."""

    def __init__(self, app):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        for _ in range(2000):
            if self.server.started:
                break
            time.sleep(0.005)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
