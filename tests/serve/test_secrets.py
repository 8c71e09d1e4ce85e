"""Upstream credentials and addresses stay out of answers, records and logs.

Records are readable by any valid token and error answers go to any client, so neither may
carry the upstream's credentials or its internal address; the server log (operators) may
name the host, never the credentials. Credentials written into ``runtime.upstream_url`` are
sent as HTTP Basic auth; together with ``runtime.api_key`` they are a configuration error.
"""

from __future__ import annotations

import base64
import logging
import socket

import pytest
from click.testing import CliRunner

from reef_core.cli import main
from reef_core.errors import ConfigError
from reef_core.testing import FakeUpstream, ReefServer, parse_sse

SECRET = "s3cret"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "one two three four five six"}]}
MSG = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "one two three four five six"}]}
ROUTES = [("/v1/chat/completions", CHAT), ("/v1/messages", MSG)]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _with_credentials(url: str, userinfo: str = f"user:{SECRET}") -> str:
    return url.replace("http://", f"http://{userinfo}@", 1) + "/v1"


def _assert_clean(text: str, address: str) -> None:
    assert SECRET not in text
    assert "user:" not in text
    assert address not in text




def _stored_error(reef: ReefServer, receipt: str) -> str:
    """The record's error as a client reads it (``GET /reef/records/{id}``) and as stored."""
    over_http = reef.client().get(f"/reef/records/{receipt}")
    assert over_http.status_code == 200, over_http.text
    stored = reef.store.get_record(receipt)
    assert over_http.json()["error"] == stored.error
    return stored.error


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize("route,body", ROUTES)
def test_unreachable_upstream_hides_credentials_and_address(tmp_path, caplog, dialect, route, body):
    caplog.set_level(logging.DEBUG)
    port = _closed_port()
    address = f"127.0.0.1:{port}"
    with ReefServer(tmp_path, upstream=_with_credentials(f"http://{address}"), dialect=dialect) as reef:
        for streamed in (False, True):
            r = reef.client().post(route, json={**body, "stream": streamed})
            assert r.status_code == 502
            _assert_clean(r.text, address)
            assert "the upstream model server is unreachable" in r.text
            error = _stored_error(reef, r.headers["x-reef-agent-record-id"])
            assert "unreachable" in error
            _assert_clean(error, address)
    assert SECRET not in caplog.text
    # operators still learn where the upstream is, from the server log
    assert f"upstream http://{address} is unreachable" in caplog.text


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_credentials_go_as_basic_auth_and_never_into_errors(tmp_path, caplog, dialect):
    caplog.set_level(logging.DEBUG)
    route, body = ROUTES[0] if dialect == "openai" else ROUTES[1]
    with FakeUpstream(dialect) as up:
        address = up.url.removeprefix("http://")
        url = _with_credentials(up.url, f"user:{SECRET}%40x")  # percent-encoded '@' in the password
        with ReefServer(tmp_path, upstream=url, dialect=dialect, overrides=["runtime.timeout_s=0.5"]) as reef:
            expected = "Basic " + base64.b64encode(f"user:{SECRET}@x".encode()).decode()
            ok = reef.client().post(route, json=body)
            assert ok.status_code == 200, ok.text
            streamed = reef.client().post(route, json={**body, "stream": True})
            assert streamed.status_code == 200 and "error" not in parse_sse(streamed.text)[-1][1]
            assert [h.get("authorization") for h in up.headers] == [expected, expected]
            assert all("x-api-key" not in h for h in up.headers)

            up.hang(seconds=5)  # the read timeout (0.5 s) fires first
            slow = reef.client().post(route, json=body)
            assert slow.status_code == 502 and "the upstream model server timed out" in slow.text
            _assert_clean(slow.text, address)
            _assert_clean(_stored_error(reef, slow.headers["x-reef-agent-record-id"]), address)

            up.cut_stream(after_events=3)
            cut = reef.client().post(route, json={**body, "stream": True})
            assert cut.status_code == 200 and "error" in parse_sse(cut.text)[-1][1]
            _assert_clean(cut.text, address)
            record = reef.wait_record(cut.headers["x-reef-agent-record-id"])
            assert record.status == "incomplete" and "stream broke" in record.error
            _assert_clean(_stored_error(reef, record.id), address)
    assert SECRET not in caplog.text


def test_url_credentials_and_api_key_is_a_one_line_config_error(tmp_path):
    url = f"http://user:{SECRET}@127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(ConfigError) as info:
        ReefServer(tmp_path, upstream=url, overrides=["runtime.api_key=sk-other"])
    message = str(info.value)
    assert "runtime.api_key" in message and "credentials" in message
    assert SECRET not in message and "\n" not in message


def test_unparsable_url_with_credentials_is_not_echoed(tmp_path):
    # httpx reads "user:zz9" as host and port here, and its own error quotes the "port"
    with pytest.raises(ConfigError) as info:
        ReefServer(tmp_path, upstream="http://user:zz9/secret@127.0.0.1/v1")
    assert "runtime.upstream_url is not a valid URL" in str(info.value)
    assert "zz9" not in str(info.value) and "secret" not in str(info.value)


def test_reef_serve_reports_the_conflict_in_one_line_without_the_password(tmp_path, monkeypatch):
    import uvicorn

    def never(*args, **kwargs):
        raise AssertionError("reef serve must stop before serving")

    monkeypatch.setattr(uvicorn, "run", never)
    result = CliRunner().invoke(main, ["serve", f"server.state_dir={tmp_path}",
                                       f"runtime.upstream_url=http://user:{SECRET}@127.0.0.1:1/v1",
                                       "runtime.api_key=sk-other"])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "runtime.api_key" in lines[0]
    assert SECRET not in result.output


def test_reef_config_masks_the_url_password(tmp_path):
    result = CliRunner().invoke(main, ["config", f"server.state_dir={tmp_path}",
                                       f"runtime.upstream_url=http://user:{SECRET}@upstream.internal/v1"])
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    assert "http://user:****@upstream.internal/v1" in result.output


async def test_sglang_runtime_sends_basic_auth_and_hides_the_address(caplog):
    pytest.importorskip("reef_sglang")
    from reef_core.errors import RuntimeUnavailable
    from reef_core.types import InferenceCall
    from reef_sglang import SGLangRuntime

    caplog.set_level(logging.DEBUG)
    call = InferenceCall(scenario="s", record_id="r", body={"model": "m", "messages": [{"role": "user",
                                                                                          "content": "hi"}]})
    with pytest.raises(ValueError, match="credentials"):
        SGLangRuntime(base_url=f"http://user:{SECRET}@127.0.0.1:1", api_key="sk-other")

    address = f"127.0.0.1:{_closed_port()}"
    rt = SGLangRuntime(base_url=f"http://user:{SECRET}@{address}", model="m", connect_timeout_s=2)
    with pytest.raises(RuntimeUnavailable) as info:
        await rt.complete(call)
    await rt.aclose()
    _assert_clean(str(info.value), address)
    assert "runtime.base_url" in str(info.value)

    with FakeUpstream("openai") as up:  # speaks the engine's OpenAI route
        rt = SGLangRuntime(base_url=up.url.replace("http://", f"http://user:{SECRET}@"), model="m")
        try:
            answer = await rt.complete(call)
        finally:
            await rt.aclose()
        assert answer["choices"][0]["message"]["content"]
        assert up.headers[-1]["authorization"] == "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
    assert SECRET not in caplog.text


def test_upstream_url_helpers():
    from reef_core.builtins.upstream import redact_url, split_url_credentials

    assert split_url_credentials("https://h.example/v1") == ("https://h.example/v1", None)
    assert split_url_credentials(f"https://u:{SECRET}@h.example:8443/v1") == ("https://h.example:8443/v1",
                                                                                ("u", SECRET))
    assert split_url_credentials("http://:tok@h/v1") == ("http://h/v1", ("", "tok"))
    assert redact_url(f"https://u:{SECRET}@h.example:8443/v1?key=k") == "https://h.example:8443"
    assert split_url_credentials(f"http://u:{SECRET}@[::1]:8000/v1")[0] == "http://[::1]:8000/v1"
    with pytest.raises(ValueError) as info:
        split_url_credentials("http://u:zz9/secret@h/v1")
    assert "zz9" not in str(info.value)
