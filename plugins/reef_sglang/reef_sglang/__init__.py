"""reef-sglang: run Reef on an SGLang (or vLLM) server, with per-scenario LoRA hot swap."""

from .runtime import SGLangRuntime

__all__ = ["SGLangRuntime"]
__version__ = "0.1.0"
