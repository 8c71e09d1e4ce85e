"""Property-based robustness of Reef's HTTP surface against a live server (hypothesis, derandomized).

For hostile chat/messages bodies, x-reef headers, reports, paging cursors, query parameters
and record ids (strategies in ``inputs.py``), whatever the input:

- no 5xx from Reef's own code (the fake upstream here never fails, so every 5xx is Reef's);
- every error answer is JSON in the route's shape with a message;
- every request is answered within ``BOUND_S`` (anything slower is a hang), and the record
  writer stays alive;
- every accepted write can be read back through every read route: an answered inference by
  ``GET /reef/records/{receipt}`` and in every page of ``GET /reef/scenarios/{s}/records``
  (followed until ``next_cursor`` is null), a stored report in the ``reports`` of each record
  it quotes; a refused report writes nothing.

The store-involved properties run on SQLite and on PostgreSQL. Examples are derandomized, so a
failure replays; the failing request is printed as ``Req(...)``.
"""

from __future__ import annotations

import gc
import itertools
import json
import traceback
import uuid
from collections import Counter
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from inputs import (
    CHAT,
    JSON_HEADERS,
    MSGS,
    REPORT,
    Body,
    ChatSpec,
    Ctx,
    Deep,
    Lost,
    Raw,
    ReportSpec,
    Req,
    ShrinkBudget,
    WriterDied,
    _b64,
    all_pages,
    chat_specs,
    cursors,
    get_record,
    header_specs,
    judge,
    read_back_chat,
    read_back_report,
    record_ids,
    record_queries,
    report_specs,
    scenario_path,
    send,
)
from responses_inputs import ResponsesSpec, responses_specs

from reef_core.testing import ReefServer


def fast(max_examples: int):
    return settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                    phases=[Phase.explicit, Phase.generate, Phase.shrink],
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])


def check_property(prop) -> None:
    """Run a hypothesis property and report a failure as text: the error, where it was raised,
    and hypothesis' failing example.

    Why not let pytest render it: on CPython 3.11, pytest's rendering of a failed run's
    traceback (``ast.parse`` of its sources) intermittently crashed the whole session with
    "SystemError: AST constructor recursion depth mismatch" (hypothesis moves the recursion
    limit; the run leaves cyclic garbage behind). Collecting that garbage first and failing
    without a traceback avoids it."""
    try:
        prop()
    except Exception as exc:  # reported below, as the test's failure
        report = _describe(exc)
    else:
        gc.collect()
        return
    gc.collect()
    pytest.fail(report, pytrace=False)


def _describe(exc: BaseException) -> str:
    parts = []
    group = getattr(exc, "exceptions", None)  # an ExceptionGroup: one failure each
    for one in (list(group) if isinstance(group, (list, tuple)) else [exc]):
        where = traceback.extract_tb(one.__traceback__)[-3:]
        parts.append("".join(traceback.format_list(where)) + "".join(traceback.format_exception_only(one)))
    return f"{len(parts)} distinct failure(s):\n\n" + "\n".join(parts)


class Live:
    """A Reef in front of a healthy fake upstream, started again when an example broke it
    (dead record writer, stopped server), so one failure does not fail every later example."""

    _names = itertools.count()

    def __init__(self, state_dir: Path, upstream, overrides: list[str]):
        self.state_dir = state_dir
        self.upstream = upstream
        self.overrides = ["runtime.timeout_s=5", "server.max_scenarios=1000000", *overrides]
        self.server: ReefServer | None = None
        self.client: httpx.Client | None = None
        self.restarts = 0
        self.suspect = False
        self.other = ""
        self.prefix = f"p{next(self._names)}"
        self._scenarios = itertools.count()

    def start(self) -> Live:
        self.server = ReefServer(self.state_dir / f"run{self.restarts}", self.overrides, upstream=self.upstream,
                                 graceful_s=1, log_level="critical").start()
        self.client = httpx.Client(base_url=self.server.url, timeout=10)
        self.other = self.receipt("other")
        return self

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.server is not None:
            self.server.stop()

    def alive(self) -> bool:
        return self.server.app.state.serve.writer.alive

    def ensure(self) -> None:
        """Before an example: a fresh server if the previous example broke this one."""
        if self.suspect:
            self.suspect = False
            self.client.close()  # a 500 may leave the connection dead without saying so
            self.client = httpx.Client(base_url=self.server.url, timeout=10)
            try:
                healthy = self.alive() and self.client.get("/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                healthy = False
            if not healthy:
                self.stop()
                self.restarts += 1
                self.start()

    def mark_suspect(self) -> None:
        """An example failed: check (and maybe restart) the server before the next one."""
        self.suspect = True

    def send(self, req: Req):
        try:
            answer = send(self.client, req, alive=self.alive)
        except AssertionError:
            self.suspect = True
            raise
        if not self.alive():
            self.suspect = True
            raise WriterDied(f"the record writer thread died serving {req!r}")
        if answer.status >= 500:
            self.suspect = True  # this example fails on the 5xx itself; the next one starts clean
        return answer

    def receipt(self, scenario: str) -> str:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        answer = self.send(Req("POST", CHAT, [*JSON_HEADERS, (b"x-reef-scenario", scenario.encode())], body))
        assert answer.status == 200, answer.body
        return answer.receipt

    def fresh(self, with_receipt: bool = False) -> Ctx:
        """A new scenario for one example (nothing an earlier example stored can disturb it)."""
        self.ensure()
        ctx = Ctx(f"{self.prefix}-{next(self._scenarios)}", other=self.other)
        if with_receipt:
            ctx.own.append(self.receipt(ctx.scenario))
        return ctx


@contextmanager
def _database(server_url: str):
    """A new, empty PostgreSQL database for one module's Reef (as ``fresh_pg_url`` does per test)."""
    import sqlalchemy as sa

    from reef_core.store.engine import normalize_url

    name = f"reef_t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(normalize_url(server_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield normalize_url(server_url).rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as c:
            c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def live(request, upstreams, tmp_path_factory):
    """A Reef on each record store, shared by the module: every example writes to a scenario of
    its own, so examples cannot disturb each other."""
    with ExitStack() as stack:
        overrides = []
        if request.param == "postgres":
            url = stack.enter_context(_database(request.getfixturevalue("postgres_url")))
            overrides.append(f"record_store.url={url}")
        server = Live(tmp_path_factory.mktemp(f"props-{request.param}"), upstreams["openai"], overrides).start()
        stack.callback(server.stop)
        yield server


# ---------------------------------------------------------------------------- inference


def _chat(route: str, extra: dict[str, Any], content: Any = "hi", stream: bool = False, raw: bytes | None = None):
    body = {"model": "m", "messages": [{"role": "user", "content": content}], **extra}
    if route == "anthropic":
        body["max_tokens"] = 16
    if stream:
        body["stream"] = True
    return ChatSpec(route, Body(body), stream) if raw is None else ChatSpec(route, RawBody(raw), stream)


class RawBody(Body):
    def __init__(self, data: bytes):
        super().__init__(None)
        self.data = data

    def render(self) -> bytes:
        return self.data


def chat_examples(route: str):
    """The shapes of the defects found by hand, always tried first (then the generated ones)."""
    cases = [
        _chat(route, {"x": Deep(995)}), _chat(route, {"x": Deep(1000)}, stream=True), _chat(route, {"x": Deep(300)}),
        _chat(route, {"x": Deep(64)}), _chat(route, {}, content="nul \x00 inside"),
        _chat(route, {}, content="nul \x00 inside", stream=True), _chat(route, {"metadata": {"k": "\x00"}}),
        _chat(route, {"model": "\x00"}), _chat(route, {"temperature": Raw("NaN")}), _chat(route, {"seed": Raw("1" + "0" * 400)}),
        _chat(route, {}, content="\ud800"), _chat(route, {}, raw=b'{"model":"m","messages":[{"role":"user","con'),
    ]

    def apply(fn):
        for spec in reversed(cases):
            fn = example(spec=spec, limit=1, order="newest")(fn)
        return fn

    return apply


def report_examples():
    def spec(fields: dict[str, Any], refs: Any = ("own",)) -> ReportSpec:
        return ReportSpec(fields, list(refs), [], None, Body(None))

    cases = [
        spec({"score": 1, "metadata": {"a": Raw("NaN")}}), spec({"score": 1, "feedback": {"a": Raw("Infinity")}}),
        spec({"feedback": "\ud800"}), spec({"feedback": "nul \x00"}), spec({"report_id": "r\x00"}),
        spec({"metadata": {"k\x00": 1}}), spec({"score": Raw("1" + "0" * 400)}), spec({"score": Raw("1e309")}),
        spec({"feedback": {"a": Deep(300)}}), spec({"metadata": {"a": Deep(3000)}}),
        spec({"score": 0.5}, ["own", "other"]), spec({"score": 0.5}, ["own", "unknown"]),
    ]

    def apply(fn):
        for case in reversed(cases):
            fn = example(spec=case)(fn)
        return fn

    return apply



@pytest.mark.parametrize("route", ["openai", "anthropic"])
def test_chat_bodies(live, route):
    """Any body on either inference route: no Reef 5xx, errors in shape, answered ones read back."""

    seen = Counter()
    budget = ShrinkBudget(on_failure=live.mark_suspect)

    @fast(60)
    @given(spec=chat_specs(route), limit=st.integers(1, 3), order=st.sampled_from(["newest", "oldest"]))
    @chat_examples(route)
    def prop(spec: ChatSpec, limit: int, order: str):
        def check():
            ctx = live.fresh()
            req = spec.build(ctx)
            answer = live.send(req)
            judge(req, answer)
            seen[answer.status] += 1
            if answer.status == 200:
                read_back_chat(live.client, req, answer, limit=limit, order=order)

        budget.run((spec.stream, spec.body.render(), limit, order), check)

    check_property(prop)
    assert {200, 400} <= set(seen), seen  # both outcomes reached: the property is not vacuous


DEEP_CASES = [62, 63, 64, 65, 200, 252, 253, 256, 300, 990, 995, 1000, 1100]


def test_deep_nesting_everywhere(live):
    """Nesting at and far past the limit, in every body that is stored: chat and messages
    (non-streamed and streamed), report feedback and metadata. Each depth is tried on its own
    scenario; every failure is listed."""
    failures = []
    for depth in DEEP_CASES:
        for kind in ("array", "object"):
            for route, stream in (("openai", False), ("openai", True), ("anthropic", False), ("anthropic", True)):
                if kind == "object" and stream:
                    continue
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": Deep(depth, kind)}
                if route == "anthropic":
                    body["max_tokens"] = 16
                if stream:
                    body["stream"] = True
                spec = ChatSpec(route, Body(body), stream)
                failures += _attempt(live, lambda ctx, s=spec: s.build(ctx), chat=True)
            for key in ("feedback", "metadata") if kind == "object" else ():
                def report(ctx, key=key, depth=depth, kind=kind):
                    body = Body({"score": 1, "references": ctx.own, key: {"d": Deep(depth, kind)}})
                    return Req("POST", REPORT, [*JSON_HEADERS, (b"x-reef-scenario", ctx.scenario.encode())],
                               body.render(), scenario=ctx.scenario, kind="report")
                failures += _attempt(live, report, chat=False)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])


def _attempt(live: Live, make, *, chat: bool) -> list[str]:
    ctx = live.fresh(with_receipt=not chat)
    req = make(ctx)
    try:
        answer = live.send(req)
        judge(req, answer)
        if answer.status == 200:
            if chat:
                read_back_chat(live.client, req, answer)
            else:
                read_back_report(live.client, req, answer)
    except AssertionError as exc:
        live.mark_suspect()
        return [f"{type(exc).__name__}: {str(exc)[:600]}"]
    return []


def responses_examples():
    """The defects found by hand: a tool type that is a list or an object, at the top level and
    inside a namespace (a 500 once: the translator looked it up in a set)."""
    namespace = {"type": "namespace", "name": "n", "tools": [{"type": {}, "name": "f"}]}
    cases = [ResponsesSpec("responses", Body({"input": "x", "tools": [{"type": []}]}), False, "tools.0.type"),
             ResponsesSpec("responses", Body({"input": "x", "tools": [namespace]}), False, "tools.0.tools.0.type"),
             ResponsesSpec("responses", Body({"input": "x", "tools": [{"type": {"a": 1}}], "stream": True}), True,
                           "tools.0.type")]

    def apply(fn):
        for spec in reversed(cases):
            fn = example(spec=spec)(fn)
        return fn

    return apply


def test_responses_bodies(live):
    """Any ``/v1/responses`` body drawn from its schema: no Reef 5xx, errors in OpenAI's shape,
    answered ones read back; a field of the wrong type anywhere in the schema is a 400 whose
    ``param`` names it."""
    seen = Counter()
    wrong_fields = set()
    budget = ShrinkBudget(on_failure=live.mark_suspect)

    @fast(120)
    @given(spec=responses_specs)
    @responses_examples()
    def prop(spec: ResponsesSpec):
        def check():
            ctx = live.fresh()
            req = spec.build(ctx)
            answer = live.send(req)
            judge(req, answer)
            seen[answer.status] += 1
            if spec.wrong is not None:
                error = answer.json().get("error") if answer.status == 400 else None
                assert error is not None and error["param"] == spec.wrong, \
                    f"a wrong type at {spec.wrong} answered {answer.status} {answer.body[:300]!r} for {req!r}"
                wrong_fields.add(spec.wrong)
            elif answer.status == 200:
                read_back_chat(live.client, req, answer)

        budget.run((spec.stream, spec.body.render()), check)

    check_property(prop)
    assert {200, 400} <= set(seen), seen
    assert len(wrong_fields) > 5, sorted(wrong_fields)  # wrong types reached many fields, not one


# ---------------------------------------------------------------------------- reports


def test_reports(live):
    """Any report: no Reef 5xx, errors in shape; a stored one reads back on every record it
    quotes (and a retry with the same report_id is the same 200); a refused one writes nothing."""

    seen = Counter()
    budget = ShrinkBudget(on_failure=live.mark_suspect)

    @fast(60)
    @given(spec=report_specs)
    @report_examples()
    def prop(spec):
        def check():
            ctx = live.fresh(with_receipt=True)
            req = spec.build(ctx)
            answer = live.send(req)
            judge(req, answer)
            seen[answer.status] += 1
            if answer.status == 200:
                read_back_report(live.client, req, answer)
                if isinstance(spec.fields.get("report_id"), str):
                    again = live.send(req)
                    assert again.status == 200 and again.json()["report_id"] == answer.json()["report_id"], \
                        f"a retry with the same report_id answered {again.status}: {again.body[:300]!r} for {req!r}"
            else:
                record = get_record(live.client, ctx.own[0])
                assert record["reports"] == [], f"a refused report ({answer.status}) was stored: {req!r}"

        budget.run(spec.build(Ctx("key", ["rec_own"], "rec_other")).content, check)

    check_property(prop)
    assert {200, 400, 404, 409, 422} <= set(seen), seen


# ---------------------------------------------------------------------------- headers


def test_reef_headers(live):
    """Odd x-reef-scenario/session/tag-* headers (bytes, lengths, counts, one huge header): no
    Reef 5xx, errors in shape; an answered request is recorded under the scenario it named,
    with every tag it sent, and reads back."""
    seen = Counter()
    budget = ShrinkBudget(on_failure=live.mark_suspect)

    @fast(60)
    @given(headers=header_specs, route=st.sampled_from(["openai", "anthropic"]))
    def prop(headers, route):
        budget.run((tuple(headers.headers()), route), lambda: check(headers, route))

    def check(headers, route):
        live.ensure()
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        if route == "anthropic":
            body["max_tokens"] = 16
        req = ChatSpec(route, Body(body), False).build(Ctx("unused"), headers=headers.headers())
        answer = live.send(req)
        judge(req, answer)
        seen[answer.status] += 1
        if answer.status == 200:
            record = read_back_chat(live.client, req, answer, scenario=headers.expected_scenario("default"))
            assert set(record.get("tags") or {}) == headers.expected_tags(), \
                f"tags {record.get('tags')!r} were recorded for {req!r}"
        for other in (Req("POST", REPORT, [*JSON_HEADERS, *headers.headers()], b'{"references": ["rec_nope"]}',
                          kind="report"),
                      Req("GET", "/reef/scenarios", headers.headers())):
            judge(other, live.send(other))

    check_property(prop)
    assert {200, 400} <= set(seen), seen


# ---------------------------------------------------------------------------- read routes


def _populate(live: Live) -> str:
    """A scenario with 12 records (statuses ok/error, sessions s1/s2) and reports on some."""
    ctx = live.fresh()
    receipts = []
    for i in range(12):
        fail = i % 5 == 4
        if fail:
            live.upstream.fail(400, "refused by the fake")
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"n{i}"}]}).encode()
        req = Req("POST", CHAT, [*JSON_HEADERS, (b"x-reef-scenario", ctx.scenario.encode()),
                                 (b"x-reef-session", b"s1" if i % 2 else b"s2")], body)
        answer = live.send(req)
        assert answer.status == (400 if fail else 200), answer.body
        receipts.append(answer.receipt)
    for i in range(0, 12, 3):
        r = live.client.post(REPORT, json={"score": i, "references": receipts[i:i + 2]},
                             headers={"x-reef-scenario": ctx.scenario})
        assert r.status_code == 200, r.text
    return ctx.scenario


def _follow(live: Live, scenario: str, params: list[tuple[str, str]]) -> int:
    req = Req("GET", f"/reef/scenarios/{scenario_path(scenario)}/records", params=params)
    answer = live.send(req)
    judge(req, answer)
    if answer.status == 200:
        page = answer.json()
        assert isinstance(page.get("records"), list) and "next_cursor" in page, f"{page!r:.300} for {req!r}"
        try:
            all_pages(live.client, scenario, params, max_pages=100)
        except Lost as exc:
            raise Lost(f"{exc} (first page answered 200 for {req!r})") from None
    return answer.status


def test_cursors(live):
    """Forged cursors (random base64url, crafted JSON with 1e309, 400-digit, negative, string,
    missing fields, deep nesting): 200 or a 4xx in shape; a 200 keeps paging to an end."""
    scenario = _populate(live)
    seen = Counter()
    budget = ShrinkBudget(on_failure=live.mark_suspect)

    @fast(80)
    @given(cursor=cursors, order=st.sampled_from([None, "newest", "oldest"]), limit=st.sampled_from([None, "1", "3"]))
    @example(cursor=_b64(b'{"s":1e309,"d":1}', False), order=None, limit=None)
    @example(cursor=_b64(b'{"s":' + b"1" * 400 + b',"d":1}', False), order=None, limit=None)
    @example(cursor=_b64(Deep(3000).encode(), False), order=None, limit=None)
    def prop(cursor, order, limit):
        params = [("cursor", cursor)] + ([("order", order)] if order else []) + ([("limit", limit)] if limit else [])

        def check():
            live.ensure()
            seen[_follow(live, scenario, params)] += 1

        budget.run(tuple(params), check)

    check_property(prop)
    assert {200, 400} <= set(seen), seen


def test_record_queries(live):
    """Odd since/until/limit/order/status/kind/session/cursor values: 200 or a 4xx in shape;
    a 200 keeps paging to an end."""
    scenario = _populate(live)
    seen = Counter()
    budget = ShrinkBudget(on_failure=live.mark_suspect)

    @fast(80)
    @given(params=record_queries())
    @example(params=[("since", "0001-01-01T00:00:00+23:59")])
    @example(params=[("until", "9999-12-31T23:59:59-23:59")])
    @example(params=[("session", "a\x00b")])
    def prop(params):
        def check():
            live.ensure()
            seen[_follow(live, scenario, params)] += 1

        budget.run(tuple(params), check)

    check_property(prop)
    assert {200, 422} <= set(seen), seen


def test_read_routes_odd_ids(live):
    """Odd record ids and scenario names in paths: 404/4xx in shape, never 5xx."""

    budget = ShrinkBudget(on_failure=live.mark_suspect)

    @fast(40)
    @given(record_id=record_ids, scenario=st.one_of(st.sampled_from(["default", "pagedx"]), record_ids))
    def prop(record_id, scenario):
        def check():
            live.ensure()
            for path in (f"/reef/records/{scenario_path(record_id)}", f"/reef/scenarios/{scenario_path(scenario)}",
                         f"/reef/scenarios/{scenario_path(scenario)}/records"):
                req = Req("GET", path)
                judge(req, live.send(req))

        budget.run((record_id, scenario), check)

    check_property(prop)


def test_paging_is_complete_and_ordered(live):
    """Whatever the page size, order and filters, following next_cursor yields exactly the
    matching records, each once, in order."""
    ctx = live.fresh()
    truth: list[dict[str, Any]] = []
    for i in range(13):
        fail = i % 4 == 3
        if fail:
            live.upstream.fail(400, "refused by the fake")
        session = f"s{i % 3}"
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"n{i}"}]}).encode()
        answer = live.send(Req("POST", CHAT, [*JSON_HEADERS, (b"x-reef-scenario", ctx.scenario.encode()),
                                                    (b"x-reef-session", session.encode())], body))
        truth.append({"id": answer.receipt, "status": "error" if fail else "ok", "session": session})

    @fast(25)
    @given(limit=st.integers(1, 6), order=st.sampled_from(["newest", "oldest"]),
           status=st.sampled_from([None, "ok", "error"]), session=st.sampled_from([None, "s0", "s1"]))
    def prop(limit, order, status, session):
        params = [("limit", str(limit)), ("order", order)]
        params += [("status", status)] if status else []
        params += [("session", session)] if session else []
        got = all_pages(live.client, ctx.scenario, params, max_pages=20)
        want = [t["id"] for t in truth if (not status or t["status"] == status)
                and (not session or t["session"] == session)]
        ids = [r["id"] for r in got]
        assert sorted(ids) == sorted(want), f"paging {params} gave {ids}, expected {want}"
        seqs = [r["seq"] for r in got]
        assert seqs == sorted(seqs, reverse=order == "newest"), f"paging {params} is out of order: {seqs}"

    check_property(prop)


def test_plain_requests_read_back(live):
    """Sanity for the suite itself: a plain request on each route is accepted and reads back
    (so the properties above are not vacuously passing on 4xx)."""
    for path, body in ((CHAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
                       (MSGS, {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})):
        for stream in (False, True):
            ctx = live.fresh()
            req = Req("POST", path, [*JSON_HEADERS, (b"x-reef-scenario", ctx.scenario.encode())],
                      json.dumps({**body, "stream": stream}).encode(), stream=stream, scenario=ctx.scenario,
                      kind="chat")
            answer = live.send(req)
            judge(req, answer)
            assert answer.status == 200, answer.body
            assert read_back_chat(live.client, req, answer)["status"] == "ok"
