"""The reflection model GEPA proposes new harness texts with, and the judge of fresh answers.

``reflection: runtime`` (the default) asks the scenario's own runtime through ``ctx.complete``
(no harness applied); ``{url, model, api_key}`` asks any OpenAI-compatible endpoint through
``dspy.LM``. A ``dspy.BaseLM`` or a plain ``prompt -> text`` callable given in-process (tests,
embedding) is used as is. Whatever it is, GEPA gets a callable ``prompt -> text``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from .data import request_view, response_text

LanguageModel = Callable[[str], str]

JUDGE_PROMPT = """You grade an AI assistant's answer to a user's request.
An earlier answer to the same request scored {score} (0 = bad, 1 = good), and the user said about it:
{feedback}

The earlier answer was:
```
{earlier}
```

The request:
```
{request}
```

The new answer:
```
{answer}
```

How well does the new answer address the user's feedback and the request? Reply with one number
between 0 and 1 on the first line, then one sentence saying why."""

_NUMBER = re.compile(r"(?<![\d.])(1(?:\.0+)?|0?\.\d+|0)(?![\d.])")


def check_reflection(spec: Any) -> None:
    """ValueError (a config error naming ``recipe.reflection``) unless ``spec`` is usable."""
    if spec == "runtime" or callable(spec):
        return
    if isinstance(spec, Mapping):
        if not spec.get("url") or not spec.get("model"):
            raise ValueError("reflection needs 'url' (an OpenAI-compatible endpoint) and 'model', "
                             "or the string 'runtime'")
        unknown = set(spec) - {"url", "model", "api_key", "temperature", "max_tokens", "timeout_s"}
        if unknown:
            raise ValueError(f"reflection takes url, model, api_key, temperature, max_tokens and timeout_s, "
                             f"not {', '.join(sorted(unknown))}")
        return
    raise ValueError("reflection must be 'runtime' or {url, model, api_key}")


def reflection_model(spec: Any, ctx: Any, *, max_tokens: int, timeout_s: float) -> LanguageModel:
    """``spec`` as GEPA's ``reflection_lm``: a callable from a prompt (text or messages) to text."""
    if spec == "runtime":
        return RuntimeLM(ctx, max_tokens=max_tokens, timeout_s=timeout_s)
    if isinstance(spec, Mapping):
        import dspy

        url = str(spec["url"]).rstrip("/")
        if url.endswith("/chat/completions"):
            url = url[: -len("/chat/completions")]
        if not url.endswith("/v1"):
            url += "/v1"
        lm = dspy.LM(f"openai/{spec['model']}", api_base=url, api_key=spec.get("api_key") or "none",
                     temperature=float(spec.get("temperature", 1.0)), max_tokens=int(spec.get("max_tokens", max_tokens)),
                     timeout=float(spec.get("timeout_s", timeout_s)), cache=False, num_retries=1)
        return DspyLM(lm)
    if _is_dspy_lm(spec):
        return DspyLM(spec)
    return spec


def _is_dspy_lm(obj: Any) -> bool:
    try:
        import dspy
    except ImportError:  # pragma: no cover - dspy is a dependency
        return False
    return isinstance(obj, dspy.BaseLM)


class DspyLM:
    """A ``dspy.BaseLM`` as GEPA's ``prompt -> text`` callable (the first completion)."""

    def __init__(self, lm: Any):
        self.lm = lm

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        out = self.lm(prompt) if isinstance(prompt, str) else self.lm(messages=prompt)
        first = out[0] if out else ""
        return str(first.get("text", "") if isinstance(first, dict) else first)


class RuntimeLM:
    """The scenario's runtime (``ctx.complete``, no harness) as a ``prompt -> text`` callable."""

    def __init__(self, ctx: Any, *, max_tokens: int, timeout_s: float):
        self.ctx = ctx
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        model = (getattr(self.ctx.settings, "runtime", None) or {}).get("model") or "default"
        body = {"model": model, "messages": messages, "max_tokens": self.max_tokens}
        return response_text(self.ctx.complete(body, None, timeout_s=self.timeout_s))


def judge(lm: LanguageModel, example: Mapping[str, Any], answer: str) -> tuple[float, str]:
    """(score, reason) the judge gives a fresh answer to a live request; (0, reason) when it
    answers with no number."""
    score = example.get("score")
    prompt = JUDGE_PROMPT.format(score="not given" if score is None else f"{score:.2f}",
                                 feedback=example["feedback"], earlier=example.get("answer") or "",
                                 request=request_view(example["request"]), answer=answer)
    text = lm(prompt).strip()
    found = _NUMBER.search(text.splitlines()[0] if text else "")
    if found is None:
        return 0.0, f"the judge gave no score ({text[:200]!r})"
    reason = " ".join(text.splitlines()[1:]).strip() or text
    return min(max(float(found.group(1)), 0.0), 1.0), reason
