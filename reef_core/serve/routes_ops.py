"""Operations routes: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from .auth import require_role
from .state import ServeState

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict:
    """Liveness: the HTTP server is up (no auth)."""
    return {"ok": True}


@router.get("/readyz", responses={503: {"description": "Not ready; `checks` says what is missing."}})
async def readyz(request: Request) -> Response:
    """Readiness (no auth, for probes): the runtime started, the record writer runs, the store answers."""
    state: ServeState = request.app.state.serve
    checks = {"runtime_started": state.started, "record_writer": state.writer.alive}
    try:
        await run_in_threadpool(state.reef.store.get_record, "readyz-probe")
        checks["record_store"] = True
    except Exception:
        checks["record_store"] = False
    ok = all(checks.values())
    return JSONResponse({"ok": ok, "checks": checks}, status_code=200 if ok else 503)


@router.get("/metrics", dependencies=[Depends(require_role("admin"))],
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}})
async def metrics(request: Request) -> Response:
    """Prometheus metrics of this server (admin token; no auth when auth is off)."""
    state: ServeState = request.app.state.serve
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
