"""What a hostile client, a broken upstream or a failing disk can do, and what Reef answers.

Each test names the defect it keeps fixed: deep JSON that used to kill the record writer or
poison read routes, crafted cursors, leaks across scenario limits, a dead worker that
liveness did not notice. The store-involved ones run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import base64
import errno
import json
import threading

import pytest
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from reef_core.serve.writer import _STOP
from reef_core.testing import ReefServer
from reef_core.testing.servers import ServerThread

CHAT = "/v1/chat/completions"
MSGS = "/v1/messages"


def nested(depth: int, leaf=1):
    """A JSON value of exactly ``depth`` levels of arrays (``nested(1) == [1]``)."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def nested_text(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def chat_body(extra_depth: int | None = None) -> dict:
    """A chat body; with ``extra_depth`` its total nesting is exactly that many levels."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    if extra_depth is not None:
        body["metadata"] = nested(extra_depth - 1)  # the body object is the first level
    return body


@pytest.fixture(scope="module")
def reef(upstreams, tmp_path_factory):
    with ReefServer(tmp_path_factory.mktemp("hostile"), upstream=upstreams["openai"]) as server:
        yield server


def _alive(reef) -> None:
    """The server still serves, records and reports healthy."""
    with reef.client(timeout=10) as c:
        r = c.post(CHAT, json=chat_body())
        assert r.status_code == 200, r.text
        assert reef.store.get_record(r.headers["x-reef-agent-record-id"]) is not None
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
    assert reef.app.state.serve.writer.alive


# ---------------------------------------------------------------------------- item 1 and 3: deep bodies


@pytest.mark.parametrize("path", [CHAT, MSGS, "/reef/report"])
@pytest.mark.parametrize("depth", [65, 300, 995, 1100, 20000])
def test_deep_bodies_are_a_400_naming_the_limit(reef, path, depth):
    raw = ('{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"metadata":'
           + nested_text(depth) + "}").encode()
    r = reef.client(timeout=10).post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "server.max_json_depth" in r.json()["error"]["message"]
    _alive(reef)


def test_deep_rollback_body_is_a_400(reef):
    raw = ('{"release_id":' + nested_text(5000) + "}").encode()
    r = reef.client(timeout=10).post("/reef/scenarios/default/rollback", content=raw,
                                     headers={"content-type": "application/json"})
    assert r.status_code in (400, 422), r.text
    _alive(reef)


def _deep_upstream(depth: int) -> ServerThread:
    """An upstream whose every answer nests ``depth`` levels deep in an unknown field."""
    text = nested_text(depth)

    async def chat(request):
        body = ('{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
                '"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"extra":' + text + "}")
        return Response(body, media_type="application/json")

    return ServerThread(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]),
                        log_level="critical", graceful_s=1)


@pytest.mark.parametrize("depth", [100, 1000])
def test_deep_upstream_answer_is_an_upstream_error_and_the_writer_survives(tmp_path, depth):
    with _deep_upstream(depth) as up, ReefServer(tmp_path, upstream=up.url, dialect="openai") as reef:
        r = reef.client(timeout=10).post(CHAT, json=chat_body())
        assert r.status_code == 502, r.text
        record = reef.store.get_record(r.headers["x-reef-agent-record-id"])
        assert record.status == "error"
        assert reef.client().get(f"/reef/records/{record.id}").status_code == 200
        assert reef.app.state.serve.writer.alive
        assert reef.client().get("/healthz").status_code == 200


# ---------------------------------------------------------------------------- item 2: read back


@pytest.mark.parametrize("limit", [64, 200])
def test_the_deepest_accepted_writes_read_back_through_every_route(upstreams, tmp_path, store_url, limit):
    overrides = [f"server.max_json_depth={limit}", f"record_store.url={store_url}"]
    with ReefServer(tmp_path, upstream=upstreams["openai"], overrides=overrides) as reef, reef.client() as c:
        over = c.post(CHAT, json=chat_body(limit + 1))
        assert over.status_code == 400
        r = c.post(CHAT, json=chat_body(limit), headers={"x-reef-scenario": "deep"})
        assert r.status_code == 200, r.text
        receipt = r.headers["x-reef-agent-record-id"]
        report = {"score": 1, "references": [receipt], "feedback": {"f": nested(limit - 2)},
                  "metadata": {"m": nested(limit - 2)}}
        assert c.post("/reef/report", json={**report, "metadata": {"m": nested(limit)}},
                      headers={"x-reef-scenario": "deep"}).status_code == 400
        rr = c.post("/reef/report", json=report, headers={"x-reef-scenario": "deep"})
        assert rr.status_code == 200, rr.text

        one = c.get(f"/reef/records/{receipt}")
        assert one.status_code == 200, one.text
        assert one.json()["request"]["metadata"] == nested(limit - 1)
        assert one.json()["reports"][0]["metadata"] == {"m": nested(limit - 2)}
        for order in ("newest", "oldest"):
            page = c.get("/reef/scenarios/deep/records", params={"order": order, "limit": 1})
            assert page.status_code == 200, page.text
            assert [x["id"] for x in page.json()["records"]] == [receipt]
        assert c.get("/reef/scenarios/deep").status_code == 200


def test_cli_reads_back_the_deepest_record(upstreams, tmp_path):
    from click.testing import CliRunner

    from reef_core.cli import main

    with ReefServer(tmp_path, upstream=upstreams["openai"]) as reef:
        r = reef.client().post(CHAT, json=chat_body(64))
        assert r.status_code == 200
        receipt = r.headers["x-reef-agent-record-id"]
    args = [f"server.state_dir={tmp_path}"]
    shown = CliRunner().invoke(main, ["records", "show", receipt, *args])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["request"]["metadata"] == nested(63)
    exported = CliRunner().invoke(main, ["records", "export", *args])
    assert exported.exit_code == 0 and receipt in exported.output


# ---------------------------------------------------------------------------- item 3: cursors and disk


def _cursor(data) -> str:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("cursor", [
    _cursor(b'{"s":1e309,"d":1}'), _cursor(b'{"s":' + b"9" * 400 + b',"d":1}'), _cursor({"s": -1, "d": 1}),
    _cursor({"s": 2**63, "d": 0}), _cursor({"s": 1.5, "d": 1}), _cursor({"s": True, "d": 1}),
    _cursor({"s": "1", "d": 1}), _cursor({"s": 1, "d": 7}), _cursor({"s": 1}), _cursor([1, 2]),
    _cursor(nested_text(5000).encode()), "x" * 5000, "%%%", "",
])
def test_crafted_cursors_are_a_400(reef, cursor):
    r = reef.client().get("/reef/scenarios/default/records", params={"cursor": cursor})
    if cursor == "":
        assert r.status_code == 200
        return
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "cursor"


def test_grow_on_a_full_disk_is_507_not_500(reef, monkeypatch):
    lp = reef.reef.learning

    async def full(scenario, progress=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lp, "grow", full)
    r = reef.client().post("/reef/scenarios/default/grow")
    assert r.status_code == 507, r.text
    assert "disk is full" in r.json()["error"]["message"]


@pytest.mark.parametrize("route", ["/reef/report", "/reef/scenarios/default/grow", "/reef/scenarios/default"])
def test_a_record_store_that_went_away_is_a_503_in_one_log_line(reef, monkeypatch, caplog, route):
    """PostgreSQL restarting or unreachable: every route that needs the store answers 503 (retry)
    in one log line each, not a 500 with a traceback per request for as long as the outage lasts
    (the catch-all handler's traceback, and uvicorn's "Exception in ASGI application" after it)."""
    from sqlalchemy.exc import OperationalError

    def down(*args, **kwargs):
        raise OperationalError("SELECT 1", {}, Exception('connection failed: connection to server at "127.0.0.1", '
                                                         "port 5432 failed: Connection refused\n\tIs the server "
                                                         "running on that host?"))

    for name in ("add_report", "get_record", "get_records", "head_release", "list_releases", "scenario_names",
                 "scenario_counts", "candidates_with_status"):
        if hasattr(reef.store, name):
            monkeypatch.setattr(reef.store, name, down)
    monkeypatch.setattr(reef.reef.learning, "grow", lambda *a, **k: down())
    client = reef.client()
    with caplog.at_level("ERROR"):
        if route == "/reef/report":
            r = client.post(route, json={"score": 1, "references": ["rec_01a2494491925197fbe181de9521afeb"]})
        elif route.endswith("/grow"):
            r = client.post(route)
        else:
            r = client.get(route)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["message"].startswith("the record store is unavailable; retry shortly")
    said = [rec for rec in caplog.records if rec.levelname == "ERROR"]
    assert len(said) == 1 and not said[0].exc_info, [rec.getMessage() for rec in said]
    assert "Connection refused" in said[0].getMessage() and "\n" not in said[0].getMessage()


# ---------------------------------------------------------------------------- supervision


def test_a_batch_that_raises_anything_fails_only_its_requests(upstreams, tmp_path, store_url):
    with ReefServer(tmp_path, upstream=upstreams["openai"], overrides=[f"record_store.url={store_url}"]) as reef:
        store = reef.store
        real = store.add_records
        calls = {"n": 0}

        class Unformattable(Exception):
            def __str__(self):
                raise RecursionError("formatting this error recurses")

        def flaky(records):
            calls["n"] += 1
            if calls["n"] == 1:
                raise Unformattable()
            return real(records)

        store.add_records = flaky
        r = reef.client(timeout=10).post(CHAT, json=chat_body())
        assert r.status_code == 503 and "recorded durably" in r.json()["error"]["message"]
        _alive(reef)


def test_a_dead_record_writer_fails_liveness(upstreams, tmp_path):
    with ReefServer(tmp_path, upstream=upstreams["openai"]) as reef:
        writer = reef.app.state.serve.writer
        writer._queue.put(_STOP)  # the thread ends although nobody closed the writer
        writer._thread.join(10)
        r = reef.client().get("/healthz")
        assert r.status_code == 503 and r.json()["dead_workers"] == ["reef-record-writer"]


def test_a_dead_growth_worker_fails_liveness(upstreams, tmp_path):
    import concurrent.futures

    with ReefServer(tmp_path, upstream=upstreams["openai"]) as reef:
        assert reef.client().get("/healthz").status_code == 200
        done = concurrent.futures.Future()
        done.set_result(None)
        reef.reef.learning.worker("sc")._task = done
        r = reef.client().get("/healthz")
        assert r.status_code == 503 and r.json()["dead_workers"] == ["reef-grow-sc"]


def test_readiness_turns_false_while_every_write_fails(upstreams, tmp_path):
    with ReefServer(tmp_path, upstream=upstreams["openai"]) as reef:
        store = reef.store
        real = store.add_records
        failing = threading.Event()
        failing.set()

        def maybe(records):
            if failing.is_set():
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(records)

        store.add_records = maybe
        assert reef.client().post(CHAT, json=chat_body()).status_code == 503
        ready = reef.client().get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["record_writes"] is False
        failing.clear()
        assert reef.client().post(CHAT, json=chat_body()).status_code == 200
        assert reef.client().get("/readyz").status_code == 200


# ---------------------------------------------------------------------------- item 10


def test_scenario_names_with_a_trailing_newline_are_refused(reef):
    for path in ("/reef/scenarios/a%0A/releases", "/reef/scenarios/a%0A/candidates"):
        r = reef.client().get(path)
        assert r.status_code == 404 and "scenario name" in r.json()["error"]["message"], r.text
    r = reef.client().post("/reef/scenarios/a%0A/grow")
    assert r.status_code == 404


TOKENS = [{"token": "adm", "role": "admin"}, {"token": "rep-a", "role": "report", "scenarios": ["a"]},
          {"token": "inf-a", "role": "infer", "scenarios": ["a"]}]


@pytest.fixture(scope="module")
def guarded(upstreams, tmp_path_factory):
    with ReefServer(tmp_path_factory.mktemp("guarded"), upstream=upstreams["openai"], tokens=TOKENS) as server:
        c = server.client("adm")
        server.receipts = {s: c.post(CHAT, json=chat_body(), headers={"x-reef-scenario": s}).headers[
            "x-reef-agent-record-id"] for s in ("a", "secret-team")}
        yield server


def test_a_limited_token_learns_nothing_about_other_scenarios(guarded):
    c = guarded.client("rep-a")
    foreign = c.post("/reef/report", json={"score": 1, "references": [guarded.receipts["secret-team"]]},
                     headers={"x-reef-scenario": "a"})
    unknown = c.post("/reef/report", json={"score": 1, "references": ["rec_doesnotexist"]},
                     headers={"x-reef-scenario": "a"})
    assert foreign.status_code == unknown.status_code == 404
    assert "secret-team" not in foreign.text
    assert foreign.json()["error"]["message"].replace(guarded.receipts["secret-team"], "R") == \
        unknown.json()["error"]["message"].replace("rec_doesnotexist", "R")
    # read routes: a foreign receipt reads exactly like an unknown one
    r1 = guarded.client("inf-a").get(f"/reef/records/{guarded.receipts['secret-team']}")
    r2 = guarded.client("inf-a").get("/reef/records/rec_doesnotexist")
    assert r1.status_code == r2.status_code == 404
    # an unlimited token still gets the precise answer
    admin = guarded.client("adm").post("/reef/report", json={"score": 1, "references": [guarded.receipts["a"]]},
                                       headers={"x-reef-scenario": "secret-team"})
    assert admin.status_code == 409 and "belongs to scenario" in admin.json()["error"]["message"]


def test_schema_and_docs_need_a_token_when_auth_is_on(guarded, reef):
    for path in ("/openapi.json", "/docs"):
        assert guarded.client().get(path).status_code == 401
        assert guarded.client("inf-a").get(path).status_code == 200
        assert reef.client().get(path).status_code == 200  # auth off: open, as every route is
    assert "/v1/chat/completions" in guarded.client("adm").get("/openapi.json").json()["paths"]
