"""Routes of the learning side: releases, candidates (with their episodes), rollback, grow,
learning modes, harness.

Read routes take any valid token (limited to its scenarios); rollback, grow and setting a
mode need ``admin``. The work is done by the kernel's ``LearningLoop`` (``reef_core.grow``); these
routes only translate HTTP to it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..commit.chain import BASE
from ..commit.harness import NO_RELEASE, HarnessBundle, harness_bundle
from ..commit.lineage import describe as describe_lineage
from ..config import LearningMode
from ..errors import NotFoundError
from ..store import to_json
from .auth import Principal, check_scenario, require_role
from .errors import ClientError
from .routes_reef import _decode_cursor, _encode_cursor, _known_scenarios
from .scenarios import header_scenario, path_scenario

router = APIRouter(tags=["learning"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "malformed request (a body that is not JSON, or nested too deeply)"},
    401: {"description": "missing or unknown token"},
    403: {"description": "token lacks the role or the scenario"},
    404: {"description": "no such scenario, release, candidate or adapter"},
    409: {"description": "conflict (stale head, a step already running)"},
    422: {"description": "a field has the wrong type or value"},
    507: {"description": "the server's disk is full; nothing was changed"},
}


class RollbackIn(BaseModel):
    """What to serve again, published as a new release: an earlier release (``release_id``), or
    the base model with no harness and no adapter (``to: "base"``); exactly one of them."""

    model_config = ConfigDict(extra="forbid")
    release_id: str | None = Field(None, min_length=1, max_length=100)
    to: Literal["base"] | None = Field(None, description='"base": no harness and no adapter')

    @model_validator(mode="after")
    def _one_target(self) -> RollbackIn:
        if (self.release_id is None) == (self.to is None):
            raise ValueError('give either release_id (an earlier release) or to: "base" (no harness, no adapter)')
        return self

    @property
    def target(self) -> str:
        return self.release_id if self.release_id is not None else BASE


class ModeIn(BaseModel):
    """The learning mode to set (``docs/modes.md``)."""

    model_config = ConfigDict(extra="forbid")
    mode: LearningMode
    #: who sets it, as ``set_by`` will say (``reef mode`` sends ``cli:<user>``); default ``api``
    set_by: str | None = Field(None, min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$")


def _learning(request: Request):
    """The learning loop, or a 409 when this server runs without one."""
    loop = request.app.state.reef.learning
    if loop is None:
        raise ClientError("this server runs without a learning loop", status=409)
    return loop


def _scenario(scenario: str, principal: Principal) -> str:
    check_scenario(principal, path_scenario(scenario))
    return scenario


@router.get("/reef/scenarios/{scenario}/releases", responses=_ERRORS)
async def list_releases(scenario: str, request: Request,
                        principal: Principal = Depends(require_role())) -> dict[str, Any]:
    """The scenario's release chain, newest first (every release, rollbacks included)."""
    _scenario(scenario, principal)
    store = request.app.state.reef.store
    rows = await run_in_threadpool(store.list_releases, scenario)
    serving = request.app.state.reef.serving_release(scenario)
    return {"scenario": scenario, "head_release_id": rows[0].release_id if rows else None,
            "serving_release_id": serving.release_id if serving else None,
            "releases": [to_json(r) for r in rows]}


@router.get("/reef/scenarios/{scenario}/lineage", responses=_ERRORS)
async def get_lineage(scenario: str, request: Request,
                      principal: Principal = Depends(require_role())) -> dict[str, Any]:
    """The scenario's learner lineage (``docs/learning.md``, "The learner lineage"): the head's
    step, the steps since the last publish, the last reset and why; ``head`` null without one."""
    _scenario(scenario, principal)
    reef = request.app.state.reef
    found = await run_in_threadpool(describe_lineage, reef.state_dir, scenario)
    serving = reef.serving_release(scenario)
    return {**found, "serving_release_id": serving.release_id if serving else None}


@router.get("/reef/scenarios/{scenario}/releases/{release_id}", responses=_ERRORS)
async def get_release(scenario: str, release_id: str, request: Request,
                      principal: Principal = Depends(require_role())) -> dict[str, Any]:
    """One release: its manifest, the unified diff against its parent, and the evaluation
    (with the candidate's decision) that admitted it."""
    _scenario(scenario, principal)
    reef = request.app.state.reef

    def read() -> dict[str, Any]:
        row = reef.releases.chain.get(scenario, release_id)
        candidate = reef.store.get_candidate(row.candidate_id) if row.candidate_id else None
        return {
            "release": to_json(row),
            "manifest": reef.releases.chain.manifest(row),
            "diff": reef.releases.chain.diff(row),
            "evaluation": candidate.evaluation if candidate else row.evaluation,
            "candidate": to_json(candidate) if candidate else None,
        }

    return await run_in_threadpool(read)


@router.get("/reef/scenarios/{scenario}/candidates", responses=_ERRORS)
async def list_candidates(scenario: str, request: Request,
                          status: str | None = Query(None, description="only candidates with this status"),
                          limit: int = Query(100, ge=1, le=1000),
                          principal: Principal = Depends(require_role())) -> dict[str, Any]:
    """Every candidate of the scenario, newest first, with its evaluation and decision
    (rejected, errored and conflicting ones too)."""
    _scenario(scenario, principal)
    store = request.app.state.reef.store
    rows = await run_in_threadpool(lambda: store.list_candidates(scenario, status=status, limit=limit))
    return {"scenario": scenario, "candidates": [to_json(r) for r in rows]}


@router.get("/reef/scenarios/{scenario}/candidates/{candidate_id}", responses=_ERRORS)
async def get_candidate(scenario: str, candidate_id: str, request: Request,
                        limit: int = Query(100, ge=1, le=1000, description="Episodes per page."),
                        cursor: str | None = Query(None, description="next_cursor of the previous page."),
                        principal: Principal = Depends(require_role())) -> dict[str, Any]:
    """One candidate (as the list shows each), where the experience it consumed is now
    (``experience``: reports and records by state), and a page of its evaluation episodes in
    order — each with the request as sent, the answer, score, grader, latency and error;
    ``next_cursor`` when more follow."""
    _scenario(scenario, principal)
    after = None
    if cursor:
        after, newest_first = _decode_cursor(cursor)
        if newest_first:  # a records cursor: episodes are only read in evaluation order
            raise ClientError("cursor: not a cursor this server issued (pass next_cursor back as is)",
                              param="cursor")
    store = request.app.state.reef.store

    def read() -> dict[str, Any]:
        row = store.get_candidate(candidate_id)
        if row is None or row.scenario != scenario:
            raise NotFoundError(f"no candidate {candidate_id!r} in scenario {scenario!r}")
        episodes = store.list_episodes(candidate_id, after=after, limit=limit + 1)
        more = len(episodes) > limit
        episodes = episodes[:limit]
        return {"scenario": scenario, "candidate": to_json(row), "experience": store.experience_of(candidate_id),
                "episodes_stored": store.episode_counts([candidate_id]).get(candidate_id, 0),
                "episodes": episodes,
                "next_cursor": _encode_cursor(episodes[-1]["position"], False) if more else None}

    return await run_in_threadpool(read)


@router.post("/reef/scenarios/{scenario}/rollback", responses=_ERRORS)
async def rollback(scenario: str, body: RollbackIn, request: Request,
                   principal: Principal = Depends(require_role("admin"))) -> dict[str, Any]:
    """Publish an earlier release's content (``release_id``), or the base model's (``to: "base"``:
    an empty harness, no adapter), as a new release and serve it (history is kept).

    ``published`` is false, and nothing changes, when the head already has that content;
    ``message`` says what happened and ``release`` is the head afterwards (null: no release yet)."""
    _scenario(scenario, principal)
    result = await request.app.state.reef.releases.rollback(scenario, body.target)
    return {"release": to_json(result.release) if result.release is not None else None,
            "published": result.published, "message": result.message}


@router.post("/reef/scenarios/{scenario}/grow", responses=_ERRORS)
async def grow(scenario: str, request: Request,
               principal: Principal = Depends(require_role("admin"))) -> Response:
    """Run one growth step now and answer what it did: the candidate, its evaluation and
    decision, the release it published, or why nothing happened. 409 while a step runs; 404
    for a scenario that does not exist (a typo grows nothing and registers nothing)."""
    _scenario(scenario, principal)
    await run_in_threadpool(_known, request, scenario)
    result = await _learning(request).grow(scenario)
    data = result.to_dict()
    if result.outcome == "busy":
        return JSONResponse({"error": {"type": "conflict", "message": result.reason}, **data}, status_code=409)
    return JSONResponse(data)


def _known(request: Request, scenario: str) -> None:
    if scenario not in _known_scenarios(request.app.state.serve):
        raise NotFoundError(f"no scenario named {scenario!r}")


@router.get("/reef/scenarios/{scenario}/mode", responses=_ERRORS)
async def get_mode(scenario: str, request: Request, principal: Principal = Depends(require_role())) -> dict[str, Any]:
    """The scenario's learning mode: ``{"scenario", "mode", "since", "set_by"}`` (``since`` and
    ``set_by`` null while the configured mode holds)."""
    _scenario(scenario, principal)
    loop = _learning(request)

    def read() -> dict[str, Any]:
        _known(request, scenario)
        return loop.modes.describe(scenario)

    return await run_in_threadpool(read)


@router.put("/reef/scenarios/{scenario}/mode", responses=_ERRORS)
async def put_mode(scenario: str, body: ModeIn, request: Request,
                   principal: Principal = Depends(require_role("admin"))) -> dict[str, Any]:
    """Set the scenario's learning mode: ``auto``, ``manual``, ``paused`` or ``record_only``.
    It is stored, survives restarts and wins over ``scenarios.<name>.mode`` from now on;
    becoming ``auto`` wakes the scenario's growth worker."""
    _scenario(scenario, principal)
    loop = _learning(request)

    def write() -> dict[str, Any]:
        _known(request, scenario)
        return loop.set_mode(scenario, body.mode, by=body.set_by or "api")

    return await run_in_threadpool(write)


def _harness_scenario(request: Request, principal: Principal) -> str:
    scenario = header_scenario(request.headers.get("x-reef-scenario"),
                               request.app.state.reef.settings.server.default_scenario)
    check_scenario(principal, scenario)
    return scenario


def _serving(request: Request, scenario: str):
    release = request.app.state.reef.serving_release(scenario)
    if release is None:
        raise NotFoundError(f"scenario {scenario!r} has no release yet; its harness is empty")
    return release


@router.get("/reef/harness", responses=_ERRORS)
async def get_harness(request: Request, principal: Principal = Depends(require_role())) -> Response:
    """The head release's harness tree (scenario from ``x-reef-scenario``): every file with its
    size, SHA-256 and content; the release id in ``x-reef-release-id``."""
    scenario = _harness_scenario(request, principal)
    release = _serving(request, scenario)
    bundle = await run_in_threadpool(harness_bundle, release)
    return JSONResponse(bundle.to_json(), headers={"x-reef-release-id": release.release_id})


def _public_url(request: Request) -> str:
    """The URL the request reached (what agent adapters point agents at), as a proxy in front
    says it was (``x-forwarded-proto``, ``x-forwarded-host``)."""
    url = request.base_url
    proto = request.headers.get("x-forwarded-proto", "").split(",")[0].strip()
    host = request.headers.get("x-forwarded-host", "").split(",")[0].strip()
    if proto in ("http", "https"):
        url = url.replace(scheme=proto)
    if host and all(c.isalnum() or c in ".-:[]" for c in host):
        url = url.replace(netloc=host)
    return str(url).rstrip("/")


@router.get("/reef/harness/install", responses=_ERRORS, response_class=Response)
async def install_harness(request: Request, adapter: str = Query("files", description="harness adapter"),
                          principal: Principal = Depends(require_role())) -> Response:
    """A self-contained, checksum-verified POSIX sh installer of the head release's harness
    tree (``sh install.sh [DEST]``), rendered by the named harness adapter: ``files`` (the tree as
    it is), or an agent's layout and settings pointing it at this server (``claude``, ``codex``,
    ``opencode``)."""
    scenario = _harness_scenario(request, principal)
    reef = request.app.state.reef
    if adapter not in reef.plugins.names("harness_adapter"):
        raise NotFoundError(f"no harness adapter {adapter!r}; installed: "
                            f"{', '.join(reef.plugins.names('harness_adapter')) or 'none'}")
    renderer = reef.build("harness_adapter", adapter, {})
    release = reef.serving_release(scenario)
    if release is None:
        # Nothing learnt yet: the installer still points the agent at this server (settings and
        # an empty harness), so an agent's first requests can become its first experience.
        bundle = HarnessBundle(scenario=scenario, release_id=NO_RELEASE, content_hash="", files=())
    else:
        bundle = await run_in_threadpool(harness_bundle, release)
    served = reef.served_models()
    bundle = replace(bundle, base_url=_public_url(request),
                     model=served[0] if served else str(reef.settings.runtime.get("model") or ""),
                     runtime_dialect=str(getattr(reef.runtime, "dialect", "") or ""))
    script = renderer.render(bundle)
    return Response(script, media_type=renderer.media_type,
                    headers={"x-reef-release-id": bundle.release_id,
                             "content-disposition": f'attachment; filename="reef-harness-{adapter}.sh"'})
