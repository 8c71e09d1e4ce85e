"""The quickstart examples run against a live Reef and a fake upstream, so the docs cannot rot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from reef_core.testing import ReefServer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("example", ["quickstart_openai", "quickstart_anthropic"])
@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
def test_quickstart(example, upstream, upstreams, tmp_path, capsys):
    with ReefServer(tmp_path, upstream=upstreams[upstream],
                    tokens=[{"token": "demo-token", "role": "admin"}]) as reef:
        out = _load(example).main(reef.url, token="demo-token")
        assert out["answer"] == "echo: What is a coral reef?"
        assert out["streamed"] == "echo: And in five words?"
        assert out["report"]["references"] == [out["receipt"], out["stream_receipt"]]
        assert out["record"]["scenario"] == "quickstart" and out["record"]["status"] == "ok"
        assert len(out["record"]["reports"]) == 1
        assert reef.store.get_record(out["stream_receipt"]).session in ("demo-1", "demo-2")
    assert "receipt:" in capsys.readouterr().out
