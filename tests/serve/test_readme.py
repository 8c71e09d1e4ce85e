"""The README's Python snippets run against a live Reef (in front of each kind of upstream)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reef_core.testing import ReefServer

README = Path(__file__).resolve().parents[2] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_both_sdk_snippets():
    assert len(SNIPPETS) == 2
    assert "from openai import OpenAI" in SNIPPETS[0] and "from anthropic import Anthropic" in SNIPPETS[1]


@pytest.mark.parametrize("index", [0, 1])
@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
def test_readme_snippet_runs(index, upstream, upstreams, tmp_path):
    code = SNIPPETS[index].replace('reef = "http://127.0.0.1:8900"', "reef = REEF_URL")
    with ReefServer(tmp_path, upstream=upstreams[upstream]) as reef:
        scope: dict = {"REEF_URL": reef.url}
        exec(compile(code, f"README snippet {index}", "exec"), scope)
        assert scope["answer"] == "echo: What is a coral reef?"
        record = reef.store.get_record(scope["receipt"])
        assert record.scenario == "support" and record.status == "ok"
        assert [r.score for r in reef.store.reports_for_records([record.id])[record.id]] == [[0.0, 1.0][index]]
