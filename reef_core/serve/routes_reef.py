"""Reef's own routes: feedback (``POST /reef/report``) and the read routes over scenarios and records."""

from __future__ import annotations

import base64
import binascii
import json
import math
from datetime import datetime, timezone
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConflictError, NotFoundError
from ..store import Report, new_id, to_json
from ..store.record_pages import PAGE_BYTES
from ..store.recordstore import RecordStore, ScenarioMismatch
from ..types import StoredReport
from . import jsonfast
from .auth import Principal, check_scenario, require_role
from .errors import ClientError
from .routes_inference import too_deep
from .scenarios import decode_name_cursor, encode_name_cursor, header_scenario, path_scenario
from .state import ServeState

router = APIRouter()


# ---------------------------------------------------------------------------- models


class ReportIn(BaseModel):
    """Feedback on one or more served responses, quoted by their receipts (in trajectory order)."""

    model_config = ConfigDict(extra="forbid")

    score: float | None = Field(None, description="A finite number; booleans, NaN and infinities are refused.")
    feedback: str | dict[str, Any] | None = Field(None, description="Free text or a structured object.")
    references: list[str] = Field(..., min_length=1, max_length=1000,
                                  description="Receipts (x-reef-agent-record-id) of the scenario, in order.")
    metadata: dict[str, Any] | None = None
    report_id: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$",
                                  description="Your id for this report: retries with the same body are idempotent "
                                              "(no control characters).")


class ReportOut(BaseModel):
    report_id: str
    scenario: str
    references: list[str]
    score: float | None
    created_at: str


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorDetail


_ERRORS = {s: {"model": ErrorOut} for s in (400, 401, 403, 404, 409, 422)}


def _parse_report(raw: bytes, max_depth: int) -> ReportIn:
    # The standard library parser, so NaN/Infinity literals reach validation and get a 422.
    try:
        data = json.loads(raw or b"")
    except RecursionError:
        raise too_deep(max_depth) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ClientError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ClientError("the request body must be a JSON object")
    if jsonfast.nesting_depth(data, max_depth) > max_depth:
        raise too_deep(max_depth)
    _check_storable(data)
    score = data.get("score")
    if isinstance(score, bool) or (score is not None and not isinstance(score, (int, float))):
        raise ClientError("score: must be a number (not a boolean or a string)", 422, param="score")
    if isinstance(score, float) and not math.isfinite(score):
        raise ClientError("score: must be a finite number (not NaN or infinite)", 422, param="score")
    try:
        return ReportIn.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        raise ClientError(f"{where}: {msg}", 422, param=where or None) from None


def _check_storable(data: dict[str, Any]) -> None:
    """Refuse what the standard library parser accepts but JSON (and PostgreSQL) does not: NaN
    and infinities (``1e999`` parses as infinity) and strings that are not Unicode (a lone
    surrogate escape such as ``"\ud800"``). ``score`` has its own, more precise message."""
    for key, value in data.items():
        if key == "score":
            continue
        stack = [value]
        while stack:
            node = stack.pop()
            if isinstance(node, float) and not math.isfinite(node):
                raise ClientError(f"{key}: NaN and infinite numbers are not JSON", 422, param=key)
            if isinstance(node, str):
                try:
                    node.encode("utf-8")
                except UnicodeEncodeError:
                    raise ClientError(f"{key}: a string is not valid Unicode (a lone surrogate)", 400,
                                      param=key) from None
            elif isinstance(node, dict):
                stack.extend(node.keys())
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)


def _report_out(row: Report) -> dict[str, Any]:
    created = row.created_at
    if created.tzinfo is None:
        created = created.replace(tzinfo=timezone.utc)
    return {"report_id": row.id, "scenario": row.scenario, "references": list(row.references or []),
            "score": row.score, "created_at": created.isoformat()}


@router.post("/reef/report", tags=["feedback"], response_model=ReportOut, responses=_ERRORS,
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": ReportIn.model_json_schema()}}}})
async def post_report(request: Request, principal: Principal = Depends(require_role("report"))) -> dict[str, Any]:
    """Store feedback quoting receipts. ``report_id`` makes retries idempotent (same body: the same
    answer; other body: 409). Unknown receipt: 404; receipt of another scenario: 409. Nothing is
    written when the report is refused."""
    state: ServeState = request.app.state.serve
    scenario = header_scenario(request.headers.get("x-reef-scenario"), state.default_scenario)
    check_scenario(principal, scenario)
    state.scenarios.admit(scenario, register=False)  # receipts belong to a known scenario: never a new one
    report = _parse_report(await request.body(), state.max_json_depth)
    _not_streaming(state, report.references, principal)
    content = {"score": report.score, "feedback": report.feedback, "references": report.references,
               "metadata": report.metadata}
    row = Report(id=report.report_id or new_id("rpt"), scenario=scenario, score=report.score,
                 feedback=report.feedback, references=report.references, meta=report.metadata,
                 body_hash=RecordStore.report_body_hash({"scenario": scenario, **content}))
    try:
        stored, created = await run_in_threadpool(state.reef.store.add_report, row)
    except ScenarioMismatch as exc:
        if not principal.allows(exc.record_scenario):
            # A token limited to scenarios learns nothing about the others: the same answer as
            # for a receipt that does not exist.
            raise NotFoundError(f"no record with receipt {exc.receipt!r}") from None
        raise
    if created:
        state.metrics.reports.labels(scenario).inc()
        state.reef.emit("report_stored", report=StoredReport.from_row(stored))
    return _report_out(stored)


def _not_streaming(state: ServeState, receipts: list[str], principal: Principal) -> None:
    """409 for a receipt whose stream this server is still answering: its record is stored when
    the stream ends, so the client is told to retry then rather than that the receipt is unknown
    (a receipt the token may not see reads as unknown, as everywhere)."""
    for receipt in receipts:
        scenario = state.streaming.get(receipt)
        if scenario is not None and principal.allows(scenario):
            raise ConflictError(f"receipt {receipt!r} is an answer still streaming; its record is stored when the "
                                f"stream ends: retry then")


# ---------------------------------------------------------------------------- read routes


def _known_scenarios(state: ServeState) -> list[str]:
    """Configured, default and token-listed scenarios, and those with stored data (one query)."""
    return sorted(state.scenarios.pinned.union(state.reef.store.scenario_names()))


@router.get("/reef/scenarios", tags=["scenarios"], responses=_ERRORS)
async def list_scenarios(
    request: Request,
    limit: int = Query(1000, ge=1, le=1000, description="Scenarios per page, by name."),
    cursor: str | None = Query(None, description="next_cursor of the previous page."),
    principal: Principal = Depends(require_role()),
) -> dict[str, Any]:
    """Scenarios this token may see, by name: configured ones, the default, those named in tokens
    and any with stored data, each with its head release; ``next_cursor`` when more follow."""
    state: ServeState = request.app.state.serve
    after = decode_name_cursor(cursor) if cursor is not None else None

    def read() -> dict[str, Any]:
        names = [n for n in _known_scenarios(state) if principal.allows(n) and (after is None or n > after)]
        page = names[:limit]
        heads = state.reef.store.head_releases(page)
        return {
            "scenarios": [{"name": n, "head_release_id": heads[n].release_id if n in heads else None} for n in page],
            "next_cursor": encode_name_cursor(page[-1]) if len(names) > limit else None,
        }

    return await run_in_threadpool(read)


@router.get("/reef/scenarios/{scenario}", tags=["scenarios"], responses=_ERRORS)
async def get_scenario(scenario: str, request: Request,
                       principal: Principal = Depends(require_role())) -> dict[str, Any]:
    """Recipe, evaluator, head release, serving release, counts and the learning loop's state."""
    state: ServeState = request.app.state.serve
    path_scenario(scenario)
    check_scenario(principal, scenario)
    reef = state.reef

    def read() -> dict[str, Any]:
        if scenario not in _known_scenarios(state):
            raise NotFoundError(f"no scenario named {scenario!r}")
        head = reef.store.head_release(scenario)
        serving = reef.serving_release(scenario)
        refused = reef.releases.refused(scenario)
        # the loop's plan also resolves the evaluator (a recipe's default_evaluator when config names none)
        loop = reef.learning.status(scenario) if reef.learning is not None else None
        configured = reef.settings.evaluator_for(scenario)[0]
        return {
            "name": scenario,
            "recipe": reef.settings.recipe.get("name"),
            "evaluator": loop["evaluator"] if loop else configured,
            "runtime": reef.runtime_name,
            "head_release": to_json(head) if head else None,
            "serving_release_id": serving.release_id if serving else None,
            # a release of the chain this server refused (release_checks) and does not serve, and why
            "refused_release": refused.to_json() if refused else None,
            "counts": reef.store.counts(scenario),
            # the learning mode (``docs/modes.md``), also without a learning loop: what is stored, else configured
            "mode": loop["mode"] if loop else _stored_or_configured_mode(reef, scenario),
            "loop": loop,
        }

    return await run_in_threadpool(read)


def _stored_or_configured_mode(reef: Any, scenario: str) -> str:
    row = reef.store.scenario_mode(scenario)
    if row is not None:
        return row.mode
    sc = reef.settings.scenarios.get(scenario)
    return sc.mode if sc is not None else "auto"


def _encode_cursor(seq: int, newest_first: bool) -> str:
    raw = json.dumps({"s": seq, "d": int(newest_first)}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


#: cursors this server issues are ~30 characters; anything much longer is not one of them
_MAX_CURSOR_CHARS = 200
_MAX_SEQ = 2**63 - 1  # the storage sequence is a 64-bit integer


def _decode_cursor(cursor: str) -> tuple[int, bool]:
    bad = ClientError("cursor: not a cursor this server issued (pass next_cursor back as is)", param="cursor")
    if len(cursor) > _MAX_CURSOR_CHARS:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        raise bad from None
    seq = data.get("s") if isinstance(data, dict) else None
    direction = data.get("d") if isinstance(data, dict) else None
    # Exactly what _encode_cursor writes: an integer sequence in range, a 0/1 direction.
    if type(seq) is not int or not 0 <= seq <= _MAX_SEQ or direction not in (0, 1) or isinstance(direction, bool):
        raise bad
    return seq, bool(direction)


def _with_reports(store: RecordStore, rows: list, reports_bytes: int = PAGE_BYTES) -> list[dict[str, Any]]:
    """The records as JSON, each with the reports quoting it, up to ``reports_bytes`` of reports
    in all (``reports_omitted``: how many more quote it)."""
    reports, omitted = store.bounded_reports_for_records([r.id for r in rows], reports_bytes)
    out = []
    for r in rows:
        data = to_json(r)
        data["reports"] = [to_json(x) for x in reports.get(r.id, [])]
        if omitted.get(r.id):
            data["reports_omitted"] = omitted[r.id]
        out.append(data)
    return out


def _as_utc(value: datetime | None, param: str) -> datetime | None:
    """Aware UTC (what the store compares against); a time without a zone is taken as UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+23:59 lies before year 1 in UTC
        raise ClientError(f"{param}: out of range once converted to UTC", 422, param=param) from None


@router.get("/reef/scenarios/{scenario}/records", tags=["records"], responses=_ERRORS)
async def list_records(
    scenario: str,
    request: Request,
    kind: str | None = Query(None, description="Record kind, e.g. inference."),
    status: Literal["ok", "error", "incomplete"] | None = Query(None),
    session: str | None = Query(None, description="Only records of this x-reef-session."),
    since: datetime | None = Query(None, description="Created at or after (ISO 8601)."),
    until: datetime | None = Query(None, description="Created before (ISO 8601)."),
    order: Literal["newest", "oldest"] = Query("newest"),
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, description="next_cursor of the previous page."),
    principal: Principal = Depends(require_role()),
) -> dict[str, Any]:
    """Records of a scenario, each with the reports quoting it, one page at a time: at most
    ``limit`` records, fewer when their bodies pass ``server.max_body_bytes`` (follow
    ``next_cursor``; a record larger than that is a page of its own)."""
    state: ServeState = request.app.state.serve
    path_scenario(scenario)
    check_scenario(principal, scenario)
    newest_first = order == "newest"
    after = before = None
    if cursor:
        seq, newest_first = _decode_cursor(cursor)
        if newest_first:
            before = seq
        else:
            after = seq
    store = state.reef.store
    since_utc, until_utc = _as_utc(since, "since"), _as_utc(until, "until")

    def read() -> dict[str, Any]:
        # A page ends early where its bodies pass server.max_body_bytes: a reader holds at most
        # about one request's worth of bodies, however large the scenario's records are.
        rows, more = store.records_page(scenario, kind=kind, status=status, session=session, since=since_utc,
                                        until=until_utc, after_seq=after, before_seq=before, limit=limit,
                                        max_bytes=state.max_body_bytes, newest_first=newest_first)
        return {"scenario": scenario, "records": _with_reports(store, rows),
                "next_cursor": _encode_cursor(rows[-1].seq, newest_first) if more and rows else None}

    return await run_in_threadpool(read)


@router.get("/reef/records/{record_id}", tags=["records"], responses=_ERRORS)
async def get_record(record_id: str, request: Request,
                     principal: Principal = Depends(require_role())) -> dict[str, Any]:
    """One record by its receipt, with the reports quoting it."""
    return await read_record(request.app.state.serve, record_id, principal)


async def read_record(state: ServeState, record_id: str, principal: Principal,
                      reports_bytes: int = PAGE_BYTES) -> dict[str, Any]:
    """The record ``record_id`` as JSON with up to ``reports_bytes`` of the reports quoting it
    (the dashboard shows less than the API answers)."""
    store = state.reef.store
    row = await run_in_threadpool(store.get_record, record_id)
    if row is None:
        _not_streaming(state, [record_id], principal)
    if row is None or not principal.allows(row.scenario):
        # Outside the token's scenarios reads exactly like a receipt that does not exist.
        raise NotFoundError(f"no record with receipt {record_id!r}")
    return (await run_in_threadpool(_with_reports, store, [row], reports_bytes))[0]
