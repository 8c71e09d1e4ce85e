"""``reef_core.testing.serve_process.ServeProcess``: a real ``reef serve`` child, the one the
demo (``DemoServer``) and the learning bench (``ReefProcess``) both run."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from reef_core.testing import FakeUpstream
from reef_core.testing.serve_process import ServeProcess


class Unready(RuntimeError):
    pass


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads the child's environment from /proc")
def test_a_served_child_with_a_token_answers_and_stops_cleanly(tmp_path, monkeypatch):
    monkeypatch.setenv("REEF_TOKEN", "not-for-the-child")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "7")
    config = {"server": {"default_scenario": "default", "log_level": "warning"}}
    with FakeUpstream("openai", lambda body: "pong") as up:
        server = ServeProcess(tmp_path / "one", config, [f"runtime.upstream_url={up.url}", "runtime.model=fake-model"],
                              token="tok-1", scenario="checks", env={"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"},
                              label="the checked server", error=Unready, ready_timeout=120)
        with server:
            assert server.running() and server.model == "fake-model"
            env = _environ(server.proc.pid)
            assert env["OMP_NUM_THREADS"] == "3" and env["MKL_NUM_THREADS"] == "7"  # this process's value wins
            assert "REEF_TOKEN" not in env and env["HF_HUB_OFFLINE"] == "1"
            assert httpx.get(f"{server.url}/v1/models").status_code == 401  # the token is required
            raw = server.openai.chat.completions.with_raw_response.create(
                model=server.model, messages=[{"role": "user", "content": "ping"}])
            assert raw.parse().choices[0].message.content == "pong"
            assert raw.headers["x-reef-agent-record-id"]
            assert server.http.get("/reef/scenarios/checks").status_code == 200
        assert not server.running() and server.proc.returncode is not None
    assert "auth" in server.config_file.read_text() and (tmp_path / "one" / "state").is_dir()


def test_a_server_that_cannot_start_raises_the_error_named_with_its_log(tmp_path):
    server = ServeProcess(tmp_path, {"server": {"no_such_option": 1}}, label="the broken server", error=Unready)
    with pytest.raises(Unready, match=r"^the broken server exited during start-up:\n") as caught:
        with server:
            pass
    assert "no_such_option" in str(caught.value)
    assert not server.running()
