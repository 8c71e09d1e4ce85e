"""TLS to an ``https`` upstream, the same on every transport (Reef's ``http1``, aiohttp, httpx).

A throwaway PKI (``tls_pki``) and fake upstreams served by uvicorn over TLS on 127.0.0.1:
an unknown CA and a certificate for another host name are refused, a configured CA bundle
(file or hashed directory) is trusted, an upstream requiring a client certificate gets
``upstream_client_cert``/``upstream_client_key``, and ``upstream_verify: false`` accepts
anything with a warning. A refused handshake is a connection failure: 502, never a 500.
"""

from __future__ import annotations

import logging
import shutil
import ssl
import subprocess

import pytest
from tls_pki import KEY_PASSWORD, Issued, Pki, make_pki

from reef_core.builtins.upstream import UpstreamRuntime
from reef_core.errors import RuntimeUnavailable
from reef_core.serve import http_transport
from reef_core.testing import FakeUpstream, ReefServer, parse_sse
from reef_core.types import InferenceCall

TRANSPORTS = ["http1", "httpx"] + (["aiohttp"] if http_transport.available() else [])
BODY = {"model": "m", "messages": [{"role": "user", "content": "over tls"}]}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_upstream(issued: Issued, client_ca: str | None = None) -> FakeUpstream:
    options = {"ssl_certfile": str(issued.cert), "ssl_keyfile": str(issued.key)}
    if client_ca:
        options.update(ssl_ca_certs=client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return FakeUpstream("openai", server_options=options)


@pytest.fixture(scope="module")
def upstreams(pki):
    """Fake upstreams over TLS: ``good`` (signed by the trusted CA), ``rogue`` (an unknown CA),
    ``other_name`` (trusted CA, certificate for other.test) and ``mtls`` (requires a client
    certificate signed by the client CA)."""
    ups = {"good": _tls_upstream(pki.server), "rogue": _tls_upstream(pki.rogue_server),
           "other_name": _tls_upstream(pki.other_name), "mtls": _tls_upstream(pki.server, str(pki.client_ca.cert))}
    try:
        for up in ups.values():
            up.start()
        yield ups
    finally:
        for up in ups.values():
            up.close()


@pytest.fixture(autouse=True)
def _forget_requests(upstreams):
    for up in upstreams.values():
        up.requests.clear()


def _runtime(url: str, transport: str, **options) -> UpstreamRuntime:
    return UpstreamRuntime(upstream_url=url + "/v1", http_transport=transport, timeout_s=10, connect_timeout_s=10,
                           **options)


async def _answers(rt: UpstreamRuntime) -> None:
    """A whole answer and a streamed one arrive through ``rt``."""
    await rt.start()
    try:
        out = await rt.complete(InferenceCall("s", "r", BODY))
        assert out["choices"][0]["message"]["content"] == "echo: over tls"
        events = [e async for e in rt.stream(InferenceCall("s", "r", {**BODY, "stream": True}))]
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) \
            == "echo: over tls"
    finally:
        await rt.aclose()


async def _refused(rt: UpstreamRuntime, caplog, up: FakeUpstream) -> str:
    """Both calls through ``rt`` fail as an unreachable upstream (502) before the upstream's
    application sees a request; returns what the server log says about it."""
    caplog.set_level(logging.WARNING, logger="reef.upstream")
    await rt.start()
    try:
        for body in (BODY, {**BODY, "stream": True}):
            with pytest.raises(RuntimeUnavailable) as err:
                if body.get("stream"):
                    async for _ in rt.stream(InferenceCall("s", "r", body)):
                        pass
                else:
                    await rt.complete(InferenceCall("s", "r", body))
            assert err.value.status == 502
            assert "unreachable" in str(err.value) or "broke" in str(err.value)
    finally:
        await rt.aclose()
    assert up.requests == []
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "reef.upstream")


# ---------------------------------------------------------------------- server certificates


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_upstream_signed_by_an_unknown_ca_is_refused(transport, upstreams, caplog):
    # the system's CAs do not know the test CA
    said = await _refused(_runtime(upstreams["good"].url, transport), caplog, upstreams["good"])
    assert "certificate verify failed" in said


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_ca_bundle_replaces_the_system_cas(transport, upstreams, pki, caplog):
    await _answers(_runtime(upstreams["good"].url, transport, upstream_ca_bundle=str(pki.ca.cert)))
    # the rogue upstream's CA is in neither the bundle nor (it replaced them) the system's CAs
    said = await _refused(_runtime(upstreams["rogue"].url, transport, upstream_ca_bundle=str(pki.ca.cert)),
                          caplog, upstreams["rogue"])
    assert "certificate verify failed" in said


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to hash a CA directory")
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_ca_bundle_may_be_a_hashed_directory(transport, upstreams, pki, tmp_path):
    directory = tmp_path / "cas"
    directory.mkdir()
    shutil.copy(pki.ca.cert, directory / "trusted.pem")
    subprocess.run(["openssl", "rehash", str(directory)], check=True, capture_output=True)
    await _answers(_runtime(upstreams["good"].url, transport, upstream_ca_bundle=str(directory)))


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_certificate_for_another_host_name_is_refused(transport, host, upstreams, pki, caplog):
    # signed by the trusted CA, so only the host-name check can refuse it
    up = upstreams["other_name"]
    url = up.url.replace("127.0.0.1", host)
    said = await _refused(_runtime(url, transport, upstream_ca_bundle=str(pki.ca.cert)), caplog, up)
    assert "mismatch" in said.lower()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_right_certificate_is_accepted_on_localhost_too(transport, upstreams, pki):
    url = upstreams["good"].url.replace("127.0.0.1", "localhost")
    await _answers(_runtime(url, transport, upstream_ca_bundle=str(pki.ca.cert)))


# ---------------------------------------------------------------------- client certificates


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_upstream_requiring_a_client_certificate_refuses_reef_without_one(transport, upstreams, pki,
                                                                                   caplog):
    await _refused(_runtime(upstreams["mtls"].url, transport, upstream_ca_bundle=str(pki.ca.cert)),
                   caplog, upstreams["mtls"])


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_configured_client_certificate_is_presented(transport, upstreams, pki):
    await _answers(_runtime(upstreams["mtls"].url, transport, upstream_ca_bundle=str(pki.ca.cert),
                            upstream_client_cert=str(pki.client.cert), upstream_client_key=str(pki.client.key)))
    assert len(upstreams["mtls"].requests) == 2


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_encrypted_client_key_opens_with_its_password(transport, upstreams, pki):
    issued = pki.client_encrypted
    await _answers(_runtime(upstreams["mtls"].url, transport, upstream_ca_bundle=str(pki.ca.cert),
                            upstream_client_cert=str(issued.cert), upstream_client_key=str(issued.key),
                            upstream_client_key_password=KEY_PASSWORD))


# ---------------------------------------------------------------------- verify: false


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_verify_false_accepts_any_certificate_and_says_so_at_start(transport, upstreams, caplog):
    caplog.set_level(logging.WARNING, logger="reef.upstream")
    for which in ("rogue", "other_name"):
        caplog.clear()
        await _answers(_runtime(upstreams[which].url, transport, upstream_verify=False))
        warnings = [r for r in caplog.records if r.name == "reef.upstream" and r.levelno == logging.WARNING]
        assert len(warnings) == 1, caplog.text
        assert "runtime.upstream_verify is false" in warnings[0].getMessage()
        assert "not checked" in warnings[0].getMessage()


async def test_verify_true_logs_no_warning(upstreams, pki, caplog):
    caplog.set_level(logging.WARNING, logger="reef.upstream")
    await _answers(_runtime(upstreams["good"].url, "http1", upstream_ca_bundle=str(pki.ca.cert)))
    assert [r for r in caplog.records if r.name == "reef.upstream"] == []


async def test_tls_options_on_a_plain_http_upstream_are_not_silently_ignored(pki, caplog):
    caplog.set_level(logging.WARNING, logger="reef.upstream")
    with FakeUpstream("openai") as up:
        await _answers(_runtime(up.url, "http1", upstream_ca_bundle=str(pki.ca.cert)))
    assert "no effect" in caplog.text


# ---------------------------------------------------------------------- through the server


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_refused_handshake_reaches_the_client_as_a_502(transport, upstreams, pki, tmp_path):
    up = upstreams["other_name"]
    overrides = [f"runtime.http_transport={transport}", f"runtime.upstream_ca_bundle={pki.ca.cert}",
                 "runtime.timeout_s=10"]
    with ReefServer(tmp_path, upstream=up, overrides=overrides) as reef:
        for streamed in (False, True):
            r = reef.client().post("/v1/chat/completions", json={**BODY, "stream": streamed})
            # what a closed port gives (tests/serve/test_failures.py), not a 500
            assert r.status_code == 502, r.text
            assert r.json()["error"]["message"] == "the upstream model server is unreachable (ConnectError)"
            assert reef.store.get_record(r.headers["x-reef-agent-record-id"]).status == "error"
    assert up.requests == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_trusted_upstream_serves_through_the_server(transport, upstreams, pki, tmp_path):
    overrides = [f"runtime.http_transport={transport}", f"runtime.upstream_ca_bundle={pki.ca.cert}",
                 f"runtime.upstream_client_cert={pki.client.cert}", f"runtime.upstream_client_key={pki.client.key}"]
    with ReefServer(tmp_path, upstream=upstreams["mtls"], overrides=overrides) as reef:
        r = reef.client().post("/v1/chat/completions", json={**BODY, "stream": True})
        assert r.status_code == 200, r.text
        assert parse_sse(r.text)[-1][1] == "[DONE]"
