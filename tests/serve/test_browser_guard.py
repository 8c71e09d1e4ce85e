"""What a web browser may ask of Reef (reef_core/serve/browser_guard.py, hosts.py): a page of
another site changes nothing (cross-site requests), and a page on another domain cannot reach
Reef by DNS rebinding (the Host allow-list), on every route, over real sockets."""

from __future__ import annotations

import ipaddress
import json
import re
import socket

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reef_core.serve.browser_guard import cross_site_refusal
from reef_core.serve.hosts import AllowedHosts, parse_allowed
from reef_core.testing import FakeUpstream, ReefServer
from reef_core.testing.serve_process import ServeProcess
from tests.loop.conftest import ask, feedback_rules_config, report, settings_for

FORM = "application/x-www-form-urlencoded"
#: what a browser sends for an HTML form on https://evil.example posting to Reef
EVIL_FORM = {"origin": "https://evil.example", "sec-fetch-site": "cross-site", "content-type": FORM}
#: the same from browsers that send no Sec-Fetch-Site (Origin only), and the reverse
CROSS_SITE = [
    EVIL_FORM,
    {"origin": "https://evil.example", "content-type": FORM},
    {"sec-fetch-site": "cross-site", "content-type": "text/plain"},
    {"origin": "null", "content-type": "text/plain"},  # a sandboxed frame, a file:// page
    {"origin": "https://reef.evil.example", "sec-fetch-site": "same-site", "content-type": "text/plain"},
]
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


def _manual_settings(tmp_path, upstream, overrides=()):
    config = feedback_rules_config(batch_size=1, evaluator={"name": "always"},
                                   scenarios={"default": {"mode": "manual"}})
    return settings_for(tmp_path, upstream, config, overrides=list(overrides))


def _error(response: httpx.Response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == error_type, error
    return error["message"]


def _releases(client: httpx.Client) -> list[str]:
    return [r["release_id"] for r in client.get("/reef/scenarios/default/releases").json()["releases"]]


def _grow_ready(client: httpx.Client, feedback: str = "Always name the capital city explicitly") -> None:
    """A record and a report for the next growth step to learn from (a rule the release lacks)."""
    receipt = ask(client, "What is the capital of Japan?").headers["x-reef-agent-record-id"]
    report(client, [receipt], score=0.0, feedback=feedback)


# ------------------------------------------------------------------------------ cross-site requests


def test_a_cross_site_form_cannot_grow_a_manual_scenario_and_the_server_s_own_pages_can(upstreams, tmp_path):
    with ReefServer(tmp_path, settings=_manual_settings(tmp_path, upstreams["openai"])) as server:
        client = server.client()
        _grow_ready(client)
        for headers in CROSS_SITE:
            refused = client.post("/reef/scenarios/default/grow", headers=headers, content=b"go=1")
            assert "cross-site" in _error(refused, 403, "cross_site_request")
        assert server.store.list_candidates("default") == [] and _releases(client) == []
        assert client.get("/reef/scenarios/default").json()["loop"]["eligible"] == 1  # the report waits

        # the dashboard's own scripts: same origin (the browser says so, and its Origin is this host)
        own = client.post("/reef/scenarios/default/grow",
                          headers={"origin": server.url, "sec-fetch-site": "same-origin"})
        assert own.status_code == 200 and own.json()["outcome"] == "published", own.text
        # a browser without Sec-Fetch-Site, on this very origin
        _grow_ready(client, "Answer in one sentence")
        assert client.post("/reef/scenarios/default/grow", headers={"origin": server.url}).json()["outcome"] \
            == "published"
        # a client that is not a browser (the CLI, curl, an SDK): neither header
        _grow_ready(client, "Be brief")
        plain = client.post("/reef/scenarios/default/grow")
        assert plain.status_code == 200 and plain.json()["outcome"] == "published", plain.text
        assert len(_releases(client)) == 3


@pytest.fixture(scope="module")
def manual(upstreams, tmp_path_factory):
    """A manual scenario with one release, a recorded answer and a report."""
    tmp_path = tmp_path_factory.mktemp("guard")
    with ReefServer(tmp_path, settings=_manual_settings(tmp_path, upstreams["openai"])) as server:
        client = server.client()
        _grow_ready(client)
        assert client.post("/reef/scenarios/default/grow").json()["outcome"] == "published"
        _grow_ready(client, "Be brief")
        yield server


def _ui_session(server: ReefServer) -> tuple[httpx.Client, str]:
    """A dashboard session (auth is off: opened by the first page) and its CSRF token."""
    browser = httpx.Client(base_url=server.url, timeout=30)
    found = re.search(r'name="csrf" value="([^"]+)"', browser.get("/ui/scenarios/default").text)
    assert found, "no CSRF token on the page"
    return browser, found.group(1)


def _snapshot(server: ReefServer, client: httpx.Client) -> tuple:
    return (server.store.counts("default"), client.get("/reef/scenarios/default/mode").json()["mode"],
            _releases(client), [c.id for c in server.store.list_candidates("default")])


@pytest.mark.parametrize("headers", CROSS_SITE, ids=["form", "origin-only", "fetch-site-only", "null", "same-site"])
def test_every_state_changing_route_refuses_a_cross_site_request_and_changes_nothing(manual, headers):
    client = manual.client()
    browser, csrf = _ui_session(manual)
    first_release = _releases(client)[-1]
    before = _snapshot(manual, client)
    receipt = client.get("/reef/scenarios/default/records").json()["records"][0]["id"]
    chat = json.dumps(CHAT)
    attempts = [
        ("POST", "/reef/report", json.dumps({"references": [receipt], "score": 1.0, "feedback": "x"})),
        ("POST", "/reef/scenarios/default/grow", "go=1"),
        ("POST", "/reef/scenarios/default/rollback", json.dumps({"release_id": first_release})),
        ("PUT", "/reef/scenarios/default/mode", json.dumps({"mode": "paused"})),
        ("POST", "/v1/chat/completions", chat),
        ("POST", "/v1/messages", json.dumps({**CHAT, "max_tokens": 10})),
        ("POST", "/v1/responses", json.dumps({"model": "fake-model", "input": "hi"})),
    ]
    for method, path, body in attempts:
        r = client.request(method, path, headers=headers, content=body)
        shape = "permission_error" if path.startswith("/v1/") else "cross_site_request"
        assert "cross-site" in _error(r, 403, shape), (method, path)
    # the dashboard's actions, even with the session's own cookie and CSRF token
    for path, form in [("/ui/scenarios/default/grow", {"csrf": csrf}),
                       ("/ui/scenarios/default/mode", {"csrf": csrf, "mode": "paused"}),
                       ("/ui/scenarios/default/rollback", {"csrf": csrf, "release_id": first_release})]:
        r = browser.post(path, data=form, headers={k: v for k, v in headers.items() if k != "content-type"})
        _error(r, 403, "cross_site_request")
    assert _snapshot(manual, client) == before
    # reading stays open to any page: without CORS headers the browser keeps the answer from it
    read = client.get("/reef/scenarios/default", headers=headers)
    assert read.status_code == 200 and "access-control-allow-origin" not in read.headers
    browser.close()


def test_the_dashboard_s_own_forms_still_work(manual):
    browser, csrf = _ui_session(manual)
    url = manual.url
    r = browser.post("/ui/scenarios/default/mode", data={"csrf": csrf, "mode": "manual"},
                     headers={"origin": url, "sec-fetch-site": "same-origin", "hx-request": "true"})
    assert r.status_code == 200 and r.headers["hx-redirect"] == "/ui/scenarios/default", r.text
    assert manual.client().get("/reef/scenarios/default/mode").json()["set_by"] == "dashboard"
    browser.close()


@pytest.mark.parametrize(("host", "origin", "site", "refused"), [
    (b"127.0.0.1:8900", None, None, False),  # not a browser
    (b"127.0.0.1:8900", b"http://127.0.0.1:8900", None, False),
    (b"LocalHost:8900", b"http://localhost:8900", None, False),
    (b"127.0.0.1:8900", b"http://127.0.0.1:8901", None, True),  # another port is another origin
    (b"127.0.0.1:8900", b"http://127.0.0.1:8900/path", None, True),  # not an origin at all
    (b"127.0.0.1:8900", b"ftp://127.0.0.1:8900", None, True),
    (None, b"http://127.0.0.1:8900", None, True),
    (b"127.0.0.1:8900", None, b"same-origin", False),
    (b"127.0.0.1:8900", b"https://reef.example", b"same-origin", False),  # a proxy rewrote Host
    (b"127.0.0.1:8900", None, b"none", False),  # typed or bookmarked by the user
    (b"127.0.0.1:8900", b"http://127.0.0.1:8900", b"same-site", False),
    (b"127.0.0.1:8900", b"http://localhost:8900", b"same-site", True),
    (b"127.0.0.1:8900", None, b"same-site", True),
    (b"127.0.0.1:8900", b"http://127.0.0.1:8900", b"cross-site", True),
    (b"127.0.0.1:8900", None, b"something-new", True),
])
def test_the_cross_site_rule(host, origin, site, refused):
    assert (cross_site_refusal(host, origin, site) is not None) == refused


# ------------------------------------------------------------------------------ Host (DNS rebinding)


@pytest.fixture(scope="module")
def named(upstreams, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("hosts")
    listed = ", ".join(f"'{entry}'" for entry in ALLOWED)
    settings = _manual_settings(tmp_path, upstreams["openai"], [f"server.allowed_hosts=[{listed}]"])
    with ReefServer(tmp_path, settings=settings) as server:
        yield server


@pytest.mark.parametrize(("method", "path", "shape"), [
    ("GET", "/reef/scenarios", "reef"), ("GET", "/reef/records/x", "reef"),
    ("POST", "/reef/scenarios/default/grow", "reef"), ("POST", "/reef/report", "reef"),
    ("GET", "/ui", "reef"), ("GET", "/ui/scenarios/default", "reef"), ("GET", "/healthz", "reef"),
    ("GET", "/v1/models", "openai"), ("POST", "/v1/chat/completions", "openai"),
    ("POST", "/v1/responses", "openai"), ("POST", "/v1/messages", "anthropic"),
])
def test_a_request_for_another_host_is_refused_on_every_route(named, method, path, shape):
    client = named.client()
    before = named.store.counts("default")
    r = client.request(method, path, headers={"host": "evil.example"}, json={**CHAT, "max_tokens": 5})
    assert r.status_code == 421, r.text
    body = r.json()
    if shape == "reef":
        assert body["error"]["type"] == "unknown_host"
    elif shape == "anthropic":
        assert body["type"] == "error"
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
    message = body["error"]["message"]
    assert "'evil.example'" in message and "server.allowed_hosts" in message
    assert named.store.counts("default") == before


def test_allowed_hosts_with_and_without_ports(named):
    client = named.client()
    port = named.url.rsplit(":", 1)[1]
    for host in ["reef.example.com", "reef.example.com:1234", "REEF.Example.com:80", "other.example:8443",
                 "10.0.0.5:1", "[2001:DB8:0::7]:9000",
                 f"localhost:{port}", "localhost", f"127.0.0.1:{port}", f"[::1]:{port}", "[0:0:0:0:0:0:0:1]"]:
        assert client.get("/reef/scenarios", headers={"host": host}).status_code == 200, host
    for host in ["other.example", "other.example:8444", f"evil.example:{port}", "10.0.0.1", "[2001:db8::7]",
                 "[2001:db8::7]:9001", "localhost.",
                 "reef.example.com.evil.example", "sub.reef.example.com"]:
        assert client.get("/reef/scenarios", headers={"host": host}).status_code == 421, host
    for host in ["local host", "[::1", "localhost:", "localhost:99999", "a:b:c"]:
        assert _error(client.get("/reef/scenarios", headers={"host": host}), 400, "bad_request"), host
    metrics = client.get("/metrics").text  # refusals are counted with the app's other errors
    assert re.search(r'reef_http_errors_total\{status="421"\} [1-9]', metrics)
    assert re.search(r'reef_http_errors_total\{status="400"\} [1-9]', metrics)


def test_two_host_headers_and_no_host_header(named):
    port = int(named.url.rsplit(":", 1)[1])
    two = _raw(port, b"GET /reef/scenarios HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n"
                     b"Connection: close\r\n\r\n")
    assert two.startswith(b"HTTP/1.1 400 ") and b"more than one Host" in two
    # HTTP/1.0 without Host (a load balancer's health probe): no browser sends that
    assert _raw(port, b"GET /healthz HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 ")


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_a_wildcard_bind_accepts_any_ip_address_and_only_listed_names():
    wildcard = AllowedHosts.for_server("0.0.0.0", ["reef.lan"])
    for host in [b"10.1.2.3:8900", b"192.168.0.7", b"[fe80::1]:8900", b"[2001:db8::1]", b"reef.lan:8900",
                 b"localhost:8900"]:
        assert wildcard.check(host) is None, host
    assert wildcard.check(b"myhost.lan:8900")[0] == 421
    assert AllowedHosts.for_server("::", []).check(b"10.0.0.5") is None
    specific = AllowedHosts.for_server("10.0.0.5", [])
    assert specific.check(b"10.0.0.5:8900") is None and specific.check(b"10.0.0.6:8900")[0] == 421
    assert AllowedHosts.for_server("127.0.0.1", ["*"]).check(b"anything.example") is None


def test_a_bad_allowed_hosts_entry_is_a_config_error():
    from reef_core.config import load_settings
    from reef_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"server.allowed_hosts.*'reef example' is not a host name"):
        load_settings(["server.allowed_hosts=['reef example']"])
    assert load_settings(["server.allowed_hosts=['*', '::1', 'a.example:1']"]).server.allowed_hosts \
        == ["*", "::1", "a.example:1"]


# The property: a Host header passes exactly when it is ``name`` or ``name:port`` (``[v6]``
# bracketed) whose name, case aside (IP addresses by value), is allowed on that port.
ALLOWED = ["reef.example.com", "other.example:8443", "10.0.0.5", "[2001:db8::7]:9000"]
_SHAPE = re.compile(r"(?:\[(?P<v6>[^\]]*)\]|(?P<name>[A-Za-z0-9._-]+))(?::(?P<port>[0-9]{1,5}))?")


def _expected(value: str, wildcard: bool) -> bool:
    m = _SHAPE.fullmatch(value)
    if m is None or (m["port"] is not None and int(m["port"]) > 65535):
        return False
    port = None if m["port"] is None else int(m["port"])
    if m["v6"] is not None:
        try:
            name: object = ipaddress.IPv6Address(m["v6"])
        except ValueError:
            return False
    else:
        try:
            name = ipaddress.IPv4Address(m["name"])
        except ValueError:
            name = m["name"].lower()
    if wildcard and isinstance(name, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return True
    rules = {(parse_allowed(e)[0], parse_allowed(e)[1]) for e in ["localhost", "127.0.0.1", "::1", *ALLOWED]}
    as_text = str(name)
    return (as_text, None) in rules or (port is not None and (as_text, port) in rules)


def _case(text: str, flips: list[bool]) -> str:
    return "".join(c.upper() if flip else c for c, flip in zip(text, flips + [False] * len(text)))


names = st.one_of(
    st.sampled_from(["reef.example.com", "other.example", "10.0.0.5", "[2001:db8::7]", "localhost", "127.0.0.1",
                     "[::1]", "[0:0::1]", "[2001:DB8:0::7]", "evil.example", "reef.example.com.evil.example",
                     "10.0.0.05", "127.1", "[10.0.0.5]", "[fe80::1%25eth0]", "", "localhost."]),
    st.from_regex(r"[a-z0-9.-]{1,20}", fullmatch=True),
    st.ip_addresses().map(lambda a: f"[{a}]" if a.version == 6 else str(a)),
)
ports = st.one_of(st.none(), st.sampled_from([80, 8443, 9000, 65535, "", "00080", "8443x"]), st.integers(0, 70000))
junk = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xff), max_size=30)


@st.composite
def host_values(draw) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(junk)
    name = draw(names)
    name = _case(name, draw(st.lists(st.booleans(), max_size=len(name))))
    port = draw(ports)
    return name if port is None else f"{name}:{port}"


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=host_values(), wildcard=st.booleans())
def test_only_allowed_host_names_pass(value, wildcard):
    hosts = AllowedHosts.for_server("0.0.0.0" if wildcard else "127.0.0.1", ALLOWED)
    got = hosts.check(value.encode("latin-1"))
    assert (got is None) == _expected(value, wildcard), (value, got)
    assert hosts.check(value.encode("latin-1")) == got  # the accepted-value cache answers the same


@settings(max_examples=60, deadline=None)
@given(value=host_values().filter(lambda v: v.isascii() and v.isprintable() and v.strip() == v and v))
def test_only_allowed_host_names_pass_over_http(named, value):
    r = named.client().get("/healthz", headers={"host": value})
    assert (r.status_code == 200) == _expected(value, False), (value, r.status_code, r.text)
    assert r.status_code in (200, 400, 421)


# ------------------------------------------------------------------------------ a real `reef serve`


def test_a_real_server_refuses_another_host_and_a_cross_site_post(tmp_path):
    with FakeUpstream("openai", lambda body: "pong") as up:
        config = {"server": {"log_level": "warning"}}
        with ServeProcess(tmp_path, config, [f"runtime.upstream_url={up.url}", "runtime.model=fake-model"],
                          ready_timeout=120) as server:
            rebound = _raw(server.port, b"GET /reef/scenarios HTTP/1.1\r\nHost: evil.example:%d\r\n"
                                        b"Connection: close\r\n\r\n" % server.port)
            head, _, body = rebound.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 421 "), rebound[:300]
            assert json.loads(body)["error"]["type"] == "unknown_host"
            own = _raw(server.port, b"GET /reef/scenarios HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                                    b"Connection: close\r\n\r\n" % server.port)
            assert own.startswith(b"HTTP/1.1 200 "), own[:300]
            forged = server.http.post("/v1/chat/completions", headers=EVIL_FORM, content=json.dumps(CHAT))
            assert forged.status_code == 403, forged.text
            assert server.http.get("/reef/scenarios/default/records").json()["records"] == []
            assert server.openai.chat.completions.create(model=server.model, messages=CHAT["messages"]) \
                .choices[0].message.content == "pong"
