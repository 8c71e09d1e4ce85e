"""The dashboard's pages: scenarios, a scenario (learning curve, releases, candidates), records,
a record, a candidate, a release.

Every read goes through the API's own route functions (``reef_core.serve.routes_reef`` and
``routes_learning``) with the session's principal, so a page sees exactly what the same token
sees over the API: the same scenario limits, the same 403 and 404 answers.
"""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse

from ..config import LEARNING_MODES
from ..serve import routes_learning, routes_reef
from ..serve.auth import Principal
from . import chart, summaries
from .progress import growth_view, scenario_mode
from .rendering import UiError, UiRoute, page_session, render

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)

#: scenarios per overview page (each row reads the scenario's state and counts its eligible experience)
SCENARIOS_PER_PAGE = 50
#: releases a scenario's page lists and marks on its curve (the newest)
PAGE_RELEASES = 50
#: bytes of reports a record's page shows (the API answers up to 16 MiB)
PAGE_REPORT_BYTES = 1024 * 1024


async def _last_candidate(request: Request, scenario: str, principal: Principal) -> dict[str, Any] | None:
    got = await routes_learning.list_candidates(scenario, request, status=None, limit=1, principal=principal)
    return got["candidates"][0] if got["candidates"] else None


@router.get("", response_class=HTMLResponse)
async def scenarios_page(request: Request, cursor: str | None = Query(None, max_length=400)) -> HTMLResponse:
    """The scenarios the session may see, by name, a page at a time: mode, serving release,
    counts, eligible experience, the last candidate and its decision."""
    principal = page_session(request).principal
    listed = await routes_reef.list_scenarios(request, limit=SCENARIOS_PER_PAGE, cursor=cursor or None,
                                              principal=principal)
    rows = []
    for item in listed["scenarios"]:
        detail = await routes_reef.get_scenario(item["name"], request, principal=principal)
        rows.append({"detail": detail, "mode": scenario_mode(detail),
                     "candidate": await _last_candidate(request, item["name"], principal)})
    return render(request, "scenarios.html", rows=rows, next_cursor=listed["next_cursor"])


@router.get("/scenarios/{scenario}", response_class=HTMLResponse)
async def scenario_page(scenario: str, request: Request) -> HTMLResponse:
    """One scenario: its state, the learning curve, releases (with rollback), candidates, and
    the admin actions."""
    principal = page_session(request).principal
    detail = await routes_reef.get_scenario(scenario, request, principal=principal)
    chain = await routes_learning.list_releases(scenario, request, principal=principal)
    candidates = await routes_learning.list_candidates(scenario, request, status=None, limit=50, principal=principal)
    store = request.app.state.reef.store
    rows = await run_in_threadpool(store.list_releases, scenario)
    # the newest releases: a scenario learning for months publishes thousands (`reef releases` lists all)
    older = max(len(rows) - PAGE_RELEASES, 0)
    chain = {**chain, "releases": chain["releases"][:PAGE_RELEASES], "older": older}
    curve = await run_in_threadpool(chart.learning_curve, store, scenario, rows[:PAGE_RELEASES])
    return render(request, "scenario.html", s=detail, chain=chain, candidates=candidates["candidates"],
                  curve=curve, plot=None if curve.empty else chart.svg(curve), mode=scenario_mode(detail),
                  modes=LEARNING_MODES,
                  growth=growth_view(request, scenario, detail.get("loop")))


def _score_bounds(min_score: str | None, max_score: str | None) -> tuple[float | None, float | None]:
    out = []
    for name, raw in (("min_score", min_score), ("max_score", max_score)):
        if raw is None or raw.strip() == "":
            out.append(None)
            continue
        try:
            value = float(raw)
        except ValueError:
            raise UiError(422, f"{name}: not a number: {raw!r}") from None
        if not math.isfinite(value):
            raise UiError(422, f"{name}: must be a finite number")
        out.append(value)
    return out[0], out[1]


@router.get("/scenarios/{scenario}/records", response_class=HTMLResponse)
async def records_page(
    scenario: str,
    request: Request,
    session: str | None = Query(None, max_length=200),
    status: str | None = Query(None, pattern="^(ok|error|incomplete)?$"),
    min_score: str | None = Query(None, max_length=40),
    max_score: str | None = Query(None, max_length=40),
    cursor: str | None = Query(None),
) -> HTMLResponse:
    """A page of the scenario's records with their reports, newest first; filters: session,
    status, and the score range of a report quoting the record (applied to each page)."""
    principal = page_session(request).principal
    lo, hi = _score_bounds(min_score, max_score)
    page = await routes_reef.list_records(
        scenario, request, kind=None, status=status or None, session=session or None, since=None, until=None,
        order="newest", limit=50, cursor=cursor or None, principal=principal)
    records = page["records"]
    if lo is not None or hi is not None:  # asked of the database: a record's reports shown may be a part of them
        store = request.app.state.reef.store
        matching = await run_in_threadpool(store.records_with_report_score, [r["id"] for r in records], lo, hi)
        records = [r for r in records if r["id"] in matching]
    filters = {"session": session or "", "status": status or "", "min_score": min_score or "",
               "max_score": max_score or ""}
    return render(request, "records.html", scenario=scenario, records=records, filters=filters,
                  next_cursor=page["next_cursor"], answer=summaries.answer_text)


@router.get("/records/{record_id}", response_class=HTMLResponse)
async def record_page(record_id: str, request: Request) -> HTMLResponse:
    """One record: request, answer, token counts, release and adapter, the reports quoting it."""
    principal = page_session(request).principal
    record = await routes_reef.read_record(request.app.state.serve, record_id, principal, reports_bytes=PAGE_REPORT_BYTES)
    return render(request, "record.html", r=record, answer=summaries.answer_text(record.get("response")),
                  tokens=summaries.token_count(record))


@router.get("/scenarios/{scenario}/candidates/{candidate_id}", response_class=HTMLResponse)
async def candidate_page(scenario: str, candidate_id: str, request: Request) -> HTMLResponse:
    """One candidate: decision, the per-task evaluation table, the gate's metrics and the
    recipe's metadata."""
    principal = page_session(request).principal
    got = await routes_learning.get_candidate(scenario, candidate_id, request, limit=1000, cursor=None,
                                              principal=principal)
    candidate = got["candidate"]
    evaluation = candidate.get("evaluation") or {}
    table = summaries.evaluation_table(evaluation, got["episodes"])
    return render(request, "candidate.html", scenario=scenario, c=candidate, got=got, table=table,
                  metrics=evaluation.get("metrics") or {}, meta=summaries.recipe_metadata(candidate.get("artifact")))


@router.get("/scenarios/{scenario}/releases/{release_id}", response_class=HTMLResponse)
async def release_page(scenario: str, release_id: str, request: Request) -> HTMLResponse:
    """One release: the diff against its parent (or the adapter's metadata), the manifest and
    the evaluation that admitted it."""
    principal = page_session(request).principal
    got = await routes_learning.get_release(scenario, release_id, request, principal=principal)
    files = await run_in_threadpool(_release_files, request, scenario, release_id, got["manifest"] or {})
    return render(request, "release.html", scenario=scenario, got=got, files=files,
                  diff=summaries.diff_lines(got["diff"]))


def _release_files(request: Request, scenario: str, release_id: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The release's files with their sizes, and an adapter's own metadata
    (``adapter/adapter_config.json``), read from the release's directory when this server has
    it materialized (the serving release always is); sizes are unknown otherwise."""
    root = request.app.state.reef.releases.chain.releases_dir / quote(scenario, safe="") / release_id
    files = []
    for path, digest in sorted((manifest.get("files") or {}).items()):
        on_disk = root / path
        files.append({"path": path, "sha256": digest,
                      "size": on_disk.stat().st_size if on_disk.is_file() else None})
    adapter_config = None
    config_path = root / "adapter" / "adapter_config.json"
    if config_path.is_file():
        try:
            adapter_config = json.loads(config_path.read_text())
        except (OSError, ValueError):
            adapter_config = None
    adapter_bytes = sum(f["size"] or 0 for f in files if f["path"].startswith("adapter/"))
    return {"files": files, "adapter_config": adapter_config,
            "adapter_bytes": adapter_bytes if any(f["path"].startswith("adapter/") for f in files) else None}
