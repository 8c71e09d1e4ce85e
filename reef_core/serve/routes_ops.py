"""Operations routes: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import JSONResponse, Response

from .auth import Principal, require_role
from .state import ServeState

router = APIRouter(tags=["ops"])


@router.get("/healthz", responses={503: {"description": "A background worker died; restart the process."}})
async def healthz(request: Request) -> Response:
    """Liveness (no auth): the HTTP server is up and no background worker (record writer,
    growth workers, release follower) has died. A 503 here asks the orchestrator to restart."""
    dead = request.app.state.serve.dead_workers()
    if dead:
        return JSONResponse({"ok": False, "dead_workers": dead}, status_code=503)
    return JSONResponse({"ok": True})


@router.get("/readyz", responses={503: {"description": "Not ready; `checks` says what is missing."}})
async def readyz(request: Request) -> Response:
    """Readiness (no auth, for probes): the runtime started, the record writer runs and its last
    write succeeded, the store answers."""
    state: ServeState = request.app.state.serve
    # record_writes: no recent batch failed whole (a full disk or a store that refuses every write
    # takes the server out of rotation for a while, then traffic shows whether it recovered)
    checks = {"runtime_started": state.started, "record_writer": state.writer.alive,
              "record_writes": not state.writer.writes_failing()}
    try:
        await run_in_threadpool(state.reef.store.get_record, "readyz-probe")
        checks["record_store"] = True
    except Exception:
        checks["record_store"] = False
    ok = all(checks.values())
    return JSONResponse({"ok": ok, "checks": checks}, status_code=200 if ok else 503)


@router.get("/metrics",
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}})
async def metrics(request: Request, principal: Principal = Depends(require_role("admin"))) -> Response:
    """Prometheus metrics of this server (admin token; no auth when auth is off). An admin token
    limited to scenarios sees only the series of its scenarios among those labelled by scenario
    (not the ``_other`` series either, which sums scenarios past the label bound)."""
    state: ServeState = request.app.state.serve
    allowed = None if principal.scenarios is None else principal.allows
    return Response(state.metrics.render(allowed), media_type=state.metrics.content_type)


@router.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_role())])
async def openapi_schema(request: Request) -> Response:
    """The OpenAPI schema of every route (any valid token when auth is on: it maps the API)."""
    return JSONResponse(request.app.openapi())


@router.get("/docs", include_in_schema=False, dependencies=[Depends(require_role())])
async def docs_page(request: Request) -> Response:
    """Swagger UI over ``/openapi.json`` (any valid token when auth is on)."""
    return get_swagger_ui_html(openapi_url="/openapi.json", title="Reef — API")
