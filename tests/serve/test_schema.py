"""Schema-driven fuzzing of every route in Reef's own /openapi.json (schemathesis).

Schemathesis generates requests from the published schema — valid ones, and ones that break it
where the schema allows that — and sends them to a live Reef with an admin token, so every
route is reachable. Checked on each answer: no 5xx (``not_a_server_error``), the status is one
the schema documents for the route (``status_code_conformance``), and error answers are JSON
in the route's shape with a message (``inputs.check_error_shape``). Examples are derandomized
and few per operation (``MAX_EXAMPLES`` each way), so the run is short and replays exactly.

(Schemathesis' own pytest integration is not used: its ``parametrize`` does not work with this
pytest. Each operation runs as one hypothesis property inside the test instead, and every
operation's failures are listed together.)
"""

from __future__ import annotations

import gc

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from inputs import Answer, BadShape, check_error_shape
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance

from reef_core.testing import ReefServer

TOKEN = "adm"
AUTH = {"authorization": f"Bearer {TOKEN}"}
MAX_EXAMPLES = 6


@pytest.fixture(scope="module")
def reef(upstreams, tmp_path_factory):
    with ReefServer(tmp_path_factory.mktemp("schema"), ["runtime.timeout_s=5"], upstream=upstreams["openai"],
                    tokens=[{"token": TOKEN, "role": "admin"}], token=TOKEN, log_level="critical") as server:
        yield server


def _check(case, reef) -> None:
    response = case.call(base_url=reef.url, headers=AUTH, timeout=10)
    case.validate_response(response, checks=[not_a_server_error, status_code_conformance], headers=AUTH)
    if response.status_code >= 400:
        answer = Answer(response.status_code, httpx.Headers(), response.content, 0.0)
        try:
            check_error_shape(case.operation.path, answer)
        except BadShape as exc:
            raise AssertionError(f"{case.method} {case.formatted_path}: {exc}") from None


def test_every_route_of_the_schema(reef):
    schema = schemathesis.openapi.from_url(f"{reef.url}/openapi.json", headers=AUTH, timeout=10)
    failures: list[str] = []
    operations = []
    for result in schema.get_all_operations():
        operation = result.ok()
        operations.append(operation.label)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                      phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                             HealthCheck.data_too_large])
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                _check(case, reef)

            try:
                run()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing in the schema to break (no parameters)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # schemathesis' FailureGroup is a BaseExceptionGroup
                failures.append(f"{operation.label} ({mode.value}): {type(exc).__name__}: {str(exc)[:1500]}")
    gc.collect()  # see test_properties.check_property
    for route in ("POST /v1/chat/completions", "POST /v1/messages", "POST /reef/report",
                  "GET /reef/scenarios/{scenario}/records", "GET /reef/records/{record_id}"):
        assert route in operations, operations
    if failures:
        pytest.fail(f"{len(failures)} operation(s) failed:\n\n" + "\n\n".join(failures), pytrace=False)


def test_schema_needs_a_token_when_auth_is_on(reef):
    """With auth on, the API description is not public either."""
    with httpx.Client(base_url=reef.url, timeout=10) as anonymous:
        for path in ("/openapi.json", "/docs"):
            r = anonymous.get(path)
            assert r.status_code == 401, (path, r.status_code, r.text[:200])
    assert reef.client().get("/openapi.json").status_code == 200
