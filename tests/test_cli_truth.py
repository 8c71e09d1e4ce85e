"""The CLI acts with the configuration the state is served with: through the running server when
there is one, refused (exit 2, nothing consumed) when the config given differs and none runs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from click.testing import CliRunner
from loop.conftest import (
    GOOD_FEEDBACK,
    ask,
    capital_model,
    feedback_rules_config,
    report,
    settings_for,
    write_config,
)
from loop.test_recovery import _seed

from reef_core.cli import main
from reef_core.cli.remote import find_server
from reef_core.compose import build_reef
from reef_core.observe import eligible
from reef_core.plugins import get_plugins
from reef_core.served_config import FILE_NAME, ServedConfig, announce, learning_view, view_hash
from reef_core.store import RecordStore
from reef_core.testing import FakeUpstream, ReefServer
from reef_core.testing.reef_server import reef_settings

CONFIG = feedback_rules_config(batch_size=1, loop_enabled=False, evaluator={"name": "always"})


def _env() -> dict[str, str]:
    """This process's environment without anything that would point the CLI elsewhere."""
    return {k: v for k, v in os.environ.items() if k not in ("REEF_URL", "REEF_TOKEN", "REEF_UPSTREAM_URL")}


def _reef(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reef_core", *args], capture_output=True, text=True,
                          env=_env(), timeout=timeout)


def _untouched(store: RecordStore, ids: tuple[str, str]) -> None:
    assert store.list_candidates("default") == []
    assert store.consumed(list(ids)) == set()
    assert len(eligible(store, "default", [])) == 1


def test_grow_with_another_config_than_served_exits_2_and_consumes_nothing(tmp_path):
    """The issue: the server ran with an override (here the upstream URL, as scripts/serve adds
    runtime=local) and `reef grow` was given the config without it."""
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=settings_for(tmp_path, up, CONFIG)):
            pass  # served once: the state directory records with what
        store = RecordStore(f"sqlite:///{tmp_path / 'state' / 'reef.db'}")
        ids = _seed(store, GOOD_FEEDBACK)
        cfg = write_config(tmp_path / "cli.yaml", CONFIG)
        state = f"server.state_dir={tmp_path / 'state'}"

        refused = _reef("grow", "-c", str(cfg), state)
        assert refused.returncode == 2, refused.stderr
        [line] = refused.stderr.strip().splitlines()
        assert line.startswith("Error: ") and "was last served with another configuration" in line
        assert f"runtime.upstream_url: served '{up.url}', given None" in line and "--force" in line
        assert refused.stdout == ""
        _untouched(store, ids)

        # forced, the runtime still cannot answer as configured: refused before anything is consumed
        forced = _reef("grow", "--force", "-c", str(cfg), state)
        assert forced.returncode == 2, forced.stderr
        assert "runtime 'upstream' cannot answer, so nothing was grown or consumed" in forced.stderr
        _untouched(store, ids)

        # the same config as served: it grows
        same = _reef("grow", "-c", str(cfg), state, f"runtime.upstream_url={up.url}")
        assert same.returncode == 0, same.stderr
        assert "default: published (candidate cand_" in same.stdout
        store.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_served(state: Path, server: subprocess.Popen, log: Path) -> ServedConfig:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert server.poll() is None, f"reef serve exited {server.returncode}: {log.read_text()}"
        served = ServedConfig.read(state)
        if served is not None and served.data.get("running") and served.url:
            try:
                if httpx.get(f"{served.url}/healthz", timeout=2).status_code == 200:
                    return served
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"reef serve did not come up: {log.read_text()}")


def test_with_a_server_running_the_cli_goes_over_http(tmp_path):
    state = tmp_path / "state"
    cfg = write_config(tmp_path / "serve.yaml", CONFIG)
    port = _free_port()
    log = tmp_path / "serve.log"
    with FakeUpstream("openai", capital_model) as up, open(log, "w") as log_file:
        server = subprocess.Popen([sys.executable, "-m", "reef_core", "serve", "-c", str(cfg),
                                   f"server.state_dir={state}", f"server.port={port}",
                                   f"runtime.upstream_url={up.url}", "server.log_level=warning"],
                                  stdout=log_file, stderr=subprocess.STDOUT, env=_env())
        try:
            served = _wait_served(state, server, log)
            assert served.data["pid"] == server.pid and served.url == f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=served.url, timeout=30) as client:
                r = ask(client, "What is the capital of Japan?")
                report(client, [r.headers["x-reef-agent-record-id"]], score=0.0, feedback=GOOD_FEEDBACK)

                # the config given lacks the server's upstream: the server's own config does the work
                grown = _reef("grow", "-c", str(cfg), f"server.state_dir={state}")
                assert grown.returncode == 0, grown.stderr
                assert grown.stdout.startswith("default: published (candidate cand_"), grown.stdout
                assert f"sent to the running server at {served.url}" in grown.stderr
                assert "the running server's configuration applies" in grown.stderr
                assert "runtime.upstream_url" in grown.stderr
                candidate_id = grown.stdout.split("(candidate ")[1].split(")")[0]
                [candidate] = client.get("/reef/scenarios/default/candidates").json()["candidates"]
                assert candidate["id"] == candidate_id and candidate["status"] == "published"
                assert ask(client, "What is the capital of Japan?").json()["choices"][0]["message"]["content"] \
                    == "The capital is Tokyo."

                listed = _reef("releases", "--json", "-c", str(cfg), f"server.state_dir={state}")
                assert listed.returncode == 0, listed.stderr
                [release] = json.loads(listed.stdout)
                assert release["candidate_id"] == candidate_id

                unknown = _reef("rollback", "rel_nope", "-c", str(cfg), f"server.state_dir={state}")
                assert unknown.returncode == 1
                [line] = unknown.stderr.strip().splitlines()[-1:]
                assert line.startswith("Error: the server at ") and "has no release 'rel_nope'" in line
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(60)
    assert server.returncode == 0, log.read_text()
    stopped = ServedConfig.read(state)
    assert stopped.data["running"] is False and stopped.data["stopped_at"]
    assert find_server(reef_settings(state, [f"runtime.upstream_url={up.url}"]), url=None, token=None) is None


def test_a_wrong_token_exits_non_zero_with_the_servers_message(tmp_path):
    cfg = write_config(tmp_path / "cli.yaml", CONFIG)
    with FakeUpstream("openai", capital_model) as up:
        with ReefServer(tmp_path, settings=reef_settings(tmp_path / "state", [f"runtime.upstream_url={up.url}"],
                                                         tokens=[{"token": "right", "role": "admin"},
                                                                 {"token": "reader", "role": "infer"}],
                                                         config_file=cfg)) as server:
            args = ["-c", str(cfg), f"server.state_dir={tmp_path / 'state'}", "--url", server.url]
            runner = CliRunner()
            wrong = runner.invoke(main, ["grow", *args, "--token", "wrong"], env={"REEF_TOKEN": None})
            assert wrong.exit_code == 2, wrong.output
            assert f"Error: the server at {server.url} answered 401: invalid token" in wrong.output
            missing = runner.invoke(main, ["rollback", "rel_x", *args], env={"REEF_TOKEN": None})
            assert missing.exit_code == 2 and "answered 401: missing bearer token" in missing.output
            reader = runner.invoke(main, ["grow", *args, "--token", "reader"], env={"REEF_TOKEN": None})
            assert reader.exit_code == 2 and "answered 403: this token has role 'infer'" in reader.output
            right = runner.invoke(main, ["grow", *args], env={"REEF_TOKEN": "right"})
            assert right.exit_code == 0, right.output
            assert "default: nothing: no eligible experience" in right.output
            assert server.store.list_candidates("default") == []
        gone = CliRunner().invoke(main, ["releases", *args])
        # the server it names is gone: exit 2 (it cannot do what was asked), never an answer from elsewhere
        assert gone.exit_code == 2 and f"cannot reach the Reef server at {server.url}" in gone.output


def test_the_served_config_is_written_at_start_and_marked_stopped(tmp_path):
    with FakeUpstream("openai", capital_model) as up:
        settings = settings_for(tmp_path, up, CONFIG, overrides=["runtime.api_key=sk-very-secret"])
        with ReefServer(tmp_path, settings=settings):
            path = settings.state_dir / FILE_NAME
            text = path.read_text()
            served = ServedConfig.read(settings.state_dir)
            assert served.data["running"] is True and served.data["pid"] == os.getpid()
            assert served.data["url"] is None  # the test server binds a port the app cannot know
            assert served.data["learning_hash"] == view_hash(learning_view(settings))
            assert served.data["learning"]["runtime"]["upstream_url"] == up.url
            assert served.data["learning"]["runtime"]["api_key"] == "****"
            assert "sk-very-secret" not in text
            assert served.mismatch(settings) == []
            assert not list(settings.state_dir.glob(f".{FILE_NAME}.*"))  # no temp file left behind
        stopped = ServedConfig.read(settings.state_dir)
        assert stopped.data["running"] is False and stopped.data["stopped_at"]
        assert stopped.data["learning"] == served.data["learning"]


def test_tokens_in_the_served_config_are_masked(tmp_path):
    settings = reef_settings(tmp_path / "state", ["runtime.upstream_url=http://127.0.0.1:9"],
                             tokens=[{"token": "tok-very-secret", "role": "admin"}])
    announced = announce(settings, url="http://127.0.0.1:1234")
    text = (settings.state_dir / FILE_NAME).read_text()
    assert "tok-very-secret" not in text
    data = json.loads(text)
    assert data["settings"]["auth"]["tokens"][0]["token"] == "****"
    assert (data["host"], data["port"]) == ("127.0.0.1", 1234)
    announced.stopped()
    assert json.loads((settings.state_dir / FILE_NAME).read_text())["running"] is False


def test_a_stale_served_config_is_not_a_running_server(tmp_path):
    """A server killed without shutting down leaves ``running: true``; its dead pid says otherwise."""
    settings = reef_settings(tmp_path / "state", ["runtime.upstream_url=http://127.0.0.1:9"])
    announce(settings, url="http://127.0.0.1:9")
    path = settings.state_dir / FILE_NAME
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": int(dead.stdout)}))
    assert find_server(settings, url=None, token=None) is None
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": os.getpid()}))
    assert find_server(settings, url=None, token=None) is None  # alive, but nothing answers its URL


def test_records_refuse_another_record_store_than_served(tmp_path):
    settings = reef_settings(tmp_path / "state", ["runtime.upstream_url=http://127.0.0.1:9"])
    announce(settings, url=None)
    over = [f"server.state_dir={tmp_path / 'state'}"]
    runner = CliRunner()
    same = runner.invoke(main, ["records", "list", *over, "runtime.upstream_url=http://other:1"])
    assert same.exit_code == 0, same.output  # only the record store matters for reading records
    other = f"record_store.url=sqlite:///{tmp_path / 'other.db'}"
    refused = runner.invoke(main, ["records", "list", *over, other])
    assert refused.exit_code == 2 and "record_store.url: served 'sqlite:///" in refused.output
    assert not (tmp_path / "other.db").exists()
    forced = runner.invoke(main, ["records", "list", "--force", *over, other])
    assert forced.exit_code == 0, forced.output


def test_a_step_whose_runtime_cannot_answer_consumes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("REEF_UPSTREAM_URL", raising=False)
    cfg = write_config(tmp_path / "cfg.yaml", CONFIG)
    settings = reef_settings(tmp_path / "state", config_file=cfg)
    reef = build_reef(settings, get_plugins(), background=False)
    ids = _seed(reef.store, GOOD_FEEDBACK)

    async def grow():
        await reef.start()
        try:
            return await reef.learning.grow("default")
        finally:
            await reef.stop()

    result = asyncio.run(grow())
    assert result.outcome == "error"
    assert result.reason.startswith("runtime 'upstream' cannot answer (nothing was consumed): ")
    assert "runtime.upstream_url" in result.reason
    store = RecordStore(settings.record_store_url)
    _untouched(store, ids)
    store.close()
