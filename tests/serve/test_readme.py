"""The README's Python snippets run against a live Reef (in front of each kind of upstream).

The snippets are written for ``scripts/serve`` (the embedded model), so the Reef here serves
exactly that model's name: a snippet naming any other model would get 404 ``model_not_found``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from reef_core.kernel import Reef
from reef_core.plugins import get_plugins
from reef_core.testing import ReefServer, reef_settings

README = Path(__file__).resolve().parents[2] / "README.md"
TEXT = README.read_text()
#: the SDK snippets: the Python blocks before "Teach it" (tests/serve/test_main_command_learns.py runs those)
SNIPPETS = re.findall(r"```python\n(.*?)```", TEXT.split("\n### Teach it\n", 1)[0], re.S)
EMBEDDED = "SmolLM2-135M-Instruct"


def test_readme_has_both_sdk_snippets():
    assert len(SNIPPETS) == 2
    assert "from openai import OpenAI" in SNIPPETS[0] and "from anthropic import Anthropic" in SNIPPETS[1]


def test_snippets_name_the_model_scripts_serve_serves():
    model_loading = pytest.importorskip("reef_torch.model_loading")
    assert model_loading.EMBEDDED_MODEL_ID == EMBEDDED
    for snippet in SNIPPETS:
        assert re.findall(r'model="([^"]+)"', snippet) == [EMBEDDED]


@pytest.mark.parametrize("index", [0, 1])
@pytest.mark.parametrize("upstream", ["openai", "anthropic"])
def test_readme_snippet_runs(index, upstream, upstreams, tmp_path):
    code = SNIPPETS[index].replace('reef = "http://127.0.0.1:8900"', "reef = REEF_URL")
    with ReefServer(tmp_path, upstream=upstreams[upstream], overrides=[f"runtime.model={EMBEDDED}"]) as reef:
        assert reef.reef.served_models() == [EMBEDDED]
        scope: dict = {"REEF_URL": reef.url}
        exec(compile(code, f"README snippet {index}", "exec"), scope)
        assert scope["answer"] == "echo: What is a coral reef?"
        record = reef.store.get_record(scope["receipt"])
        assert record.scenario == "support" and record.status == "ok"
        assert record.request["model"] == EMBEDDED
        assert [r.score for r in reef.store.reports_for_records([record.id])[record.id]] == [[0.0, 1.0][index]]


def test_readme_alias_example_is_valid_config(tmp_path):
    commands = [line for line in re.findall(r"```sh\n(.*?)```", TEXT, re.S) if "model_aliases" in line]
    assert len(commands) == 1
    argv = shlex.split(commands[0])
    assert argv[0] == "scripts/serve"
    pytest.importorskip("reef_torch")
    # scripts/serve's own overrides (its `exec .venv/bin/reef serve ... "$@"`); building the runtime loads no model
    serve = next(ln for ln in (README.parent / "scripts" / "serve").read_text().splitlines() if ln.startswith("exec "))
    serve_overrides = shlex.split(serve)[3:-1]
    reef = Reef(reef_settings(tmp_path, [*serve_overrides, *argv[1:]]), get_plugins())  # checks the alias targets
    try:
        assert reef.model_aliases == {"gpt-4o-mini": EMBEDDED, "claude-haiku-4-5": EMBEDDED}
        assert reef.resolve_model({"model": "claude-haiku-4-5"})["model"] == EMBEDDED
    finally:
        reef.store.close()
