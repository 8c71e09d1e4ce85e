"""The search harness's connection to Reef: the official ``openai`` SDK for sampling (the
receipt and the serving release come back in the response headers) and ``/reef/report`` and
the scenario routes over ``httpx``. Nothing here is private to Reef: any client could do this."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Sampled:
    receipt: str
    text: str
    release_id: str | None


class ReefClient:
    """One scenario of one Reef server."""

    def __init__(self, url: str, *, token: str | None = None, scenario: str = "default", model: str | None = None,
                 timeout: float = 600.0):
        from openai import OpenAI

        self.url = url.rstrip("/")
        self.scenario = scenario
        headers = {"x-reef-scenario": scenario}
        auth = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, timeout=timeout, headers={**headers, **auth})
        self.openai = OpenAI(base_url=f"{self.url}/v1", api_key=token or "unused", max_retries=2, timeout=timeout,
                             default_headers=headers)
        self._model = model

    @property
    def model(self) -> str:
        if not self._model:
            self._model = self.http.get("/v1/models").raise_for_status().json()["data"][0]["id"]
        return self._model

    def sample(self, messages: list[dict[str, str]], *, temperature: float, top_p: float, max_tokens: int,
               tags: dict[str, str] | None = None) -> Sampled:
        headers = {f"x-reef-tag-{k}": str(v) for k, v in (tags or {}).items()}
        raw = self.openai.chat.completions.with_raw_response.create(
            model=self.model, messages=messages, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
            extra_headers=headers)
        text = raw.parse().choices[0].message.content or ""
        return Sampled(raw.headers["x-reef-agent-record-id"], text, raw.headers.get("x-reef-release-id"))

    def report(self, receipt: str, score: float, metadata: dict[str, Any], report_id: str | None = None) -> None:
        body: dict[str, Any] = {"references": [receipt], "score": score, "metadata": metadata}
        if report_id:
            body["report_id"] = report_id
        self.http.post("/reef/report", json=body).raise_for_status()

    def scenario_state(self) -> dict[str, Any]:
        return self.http.get(f"/reef/scenarios/{self.scenario}").raise_for_status().json()

    def candidates(self, limit: int = 50) -> list[dict[str, Any]]:
        return self.http.get(f"/reef/scenarios/{self.scenario}/candidates",
                             params={"limit": limit}).raise_for_status().json()["candidates"]

    def close(self) -> None:
        self.http.close()
        self.openai.close()
