"""docs/recipes/*.md: the client examples talk to the server the page sets up, on the port and
with the model name it serves."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from reef_core.config import ServerSettings
from reef_core.testing import FakeUpstream, ReefServer

GEPA_MD = (Path(__file__).resolve().parents[1] / "docs" / "recipes" / "gepa.md").read_text()


def _block(text: str, language: str, containing: str) -> str:
    return next(b for b in re.findall(rf"```{language}\n(.*?)```", text, re.S) if containing in b)


def test_the_gepa_client_example_reaches_the_served_model_on_the_default_port(tmp_path):
    config = yaml.safe_load(_block(GEPA_MD, "yaml", "recipe:"))
    client = _block(GEPA_MD, "python", "/reef/report")
    default_url = f"http://127.0.0.1:{ServerSettings().port}"
    assert f'base_url="{default_url}"' in client  # reef serve's port, as the page says
    runtime = config["runtime"]
    # the page's runtime, in front of a fake of its upstream (the recipe is not what is checked here)
    with FakeUpstream("openai", lambda body: "Eight.", model=runtime["model"]) as up, \
            ReefServer(tmp_path, [f"runtime.model={runtime['model']}"], upstream=up) as reef:
        exec(compile(client.replace(default_url, reef.url), "gepa.md", "exec"), {})  # noqa: S102
        records = reef.store.list_records("default")
        assert [r.status for r in records] == ["ok"] and records[0].model == runtime["model"]
        assert reef.store.reports_for_records([records[0].id])[records[0].id]
