"""Auth matrix: every route × role × scenario limit; /healthz (and /readyz) open."""

from __future__ import annotations

import pytest

from reef_core.serve.auth import Principal, TokenTable
from reef_core.testing import ReefServer

TOKENS = [
    {"token": "tok-infer", "role": "infer"},
    {"token": "tok-infer-a", "role": "infer", "scenarios": ["a"]},
    {"token": "tok-report", "role": "report"},
    {"token": "tok-report-a", "role": "report", "scenarios": ["a"]},
    {"token": "tok-admin", "role": "admin"},
    {"token": "tok-admin-a", "role": "admin", "scenarios": ["a"]},
]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MSG = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def reef(upstreams, tmp_path_factory):
    with ReefServer(tmp_path_factory.mktemp("auth"), upstream=upstreams["openai"], tokens=TOKENS) as server:
        c = server.client("tok-admin")
        receipts = {}
        for s in ("a", "b"):
            r = c.post("/v1/chat/completions", json=CHAT, headers={"x-reef-scenario": s})
            assert r.status_code == 200
            receipts[s] = r.headers["x-reef-agent-record-id"]
        server.receipts = receipts
        yield server


def _roles(token: str | None) -> tuple[str | None, set[str] | None]:
    for t in TOKENS:
        if t["token"] == token:
            return t["role"], set(t["scenarios"]) if t.get("scenarios") else None
    return None, None


def _expected(token, needs: str | None, scenario: str) -> int:
    role, scenarios = _roles(token)
    if role is None:
        return 401
    if needs is not None and role not in (needs, "admin"):
        return 403
    if scenarios is not None and scenario not in scenarios:
        return 403
    return 200


ALL_TOKENS = [None, "wrong-token"] + [t["token"] for t in TOKENS]


def _call(reef, token, route, scenario):
    c = reef.client(token or "") if token else reef.client()
    h = {"x-reef-scenario": scenario}
    if route == "chat":
        return c.post("/v1/chat/completions", json=CHAT, headers=h)
    if route == "messages":
        return c.post("/v1/messages", json=MSG, headers=h)
    if route == "models":
        return c.get("/v1/models", headers=h)
    if route == "report":
        return c.post("/reef/report", json={"score": 1, "references": [reef.receipts[scenario]]}, headers=h)
    if route == "scenario":
        return c.get(f"/reef/scenarios/{scenario}")
    if route == "records":
        return c.get(f"/reef/scenarios/{scenario}/records")
    if route == "record":
        return c.get(f"/reef/records/{reef.receipts[scenario]}")
    if route == "metrics":
        return c.get("/metrics")
    raise AssertionError(route)


NEEDS = {"chat": "infer", "messages": "infer", "models": "infer", "report": "report", "scenario": None,
         "records": None, "record": None}


@pytest.mark.parametrize("route", sorted(NEEDS))
@pytest.mark.parametrize("scenario", ["a", "b"])
@pytest.mark.parametrize("token", ALL_TOKENS)
def test_route_role_scenario_matrix(reef, route, scenario, token):
    expected = _expected(token, NEEDS[route], scenario)
    if route == "models" and expected == 403 and _roles(token)[0] in ("infer", "admin"):
        expected = 200  # listing models is not scenario-specific
    if route == "record" and expected == 403 and _roles(token)[1] is not None:
        expected = 404  # a receipt outside the token's scenarios reads like one that does not exist
    r = _call(reef, token, route, scenario)
    assert r.status_code == expected, (route, scenario, token, r.text)
    if expected != 200:
        body = r.json()
        msg = body["error"]["message"]
        assert msg
        if route == "messages":
            assert body["type"] == "error"
    if expected == 401:
        assert r.headers.get("www-authenticate") == "Bearer"


@pytest.mark.parametrize("token", ALL_TOKENS)
def test_metrics_admin_only(reef, token):
    role, scenarios = _roles(token)
    expected = 401 if role is None else (200 if role == "admin" else 403)
    assert _call(reef, token, "metrics", "a").status_code == expected


def test_a_403_names_the_roles_the_route_takes_once(reef):
    r = _call(reef, "tok-report", "metrics", "a")
    assert r.status_code == 403
    assert r.json()["error"]["message"] == "this token has role 'report'; this route needs 'admin'"


def test_scenarios_list_limited_to_token(reef):
    names = {s["name"] for s in reef.client("tok-infer-a").get("/reef/scenarios").json()["scenarios"]}
    assert names == {"a"}
    names = {s["name"] for s in reef.client("tok-report").get("/reef/scenarios").json()["scenarios"]}
    assert {"a", "b", "default"} <= names


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_probes_are_open(reef, path):
    r = reef.client().get(path)
    assert r.status_code == 200 and r.json()["ok"] is True


def test_anthropic_sdk_key_header_accepted(reef):
    client = reef.anthropic()
    import anthropic

    ok = anthropic.Anthropic(base_url=reef.url, api_key="tok-infer", max_retries=0)
    assert ok.messages.create(**MSG).content[0].text == "echo: hi"
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(**MSG)


def test_token_table_keeps_only_digests():
    table = TokenTable([{"token": "s3cret", "role": "admin", "scenarios": None}])
    assert "s3cret" not in repr(table.__dict__)
    assert table.lookup("s3cret") == Principal(role="admin")
    assert table.lookup("s3cre") is None and table.lookup("") is None
    with pytest.raises(ValueError):
        TokenTable([{"token": "x", "role": "root"}])


def test_auth_off_without_tokens(reefs):
    r = reefs["openai"].client().get("/metrics")
    assert r.status_code == 200 and b"reef_requests_total" in r.content
