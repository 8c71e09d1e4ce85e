"""Errors a route raises that Reef answers itself are not handed on to the server's log as well.

Starlette gives an exception that only the catch-all ``Exception`` handler matches back to the
server after that handler answered (uvicorn then logs "Exception in ASGI application" with a
traceback): right for a bug, which ``internal_error`` logs once itself, wrong for a full disk or a
database that went away, which are one log line each. In process, an exception handed back
reaches the caller (``raise_app_exceptions``), which makes it visible here."""

from __future__ import annotations

import errno

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.exc import OperationalError

from reef_core.serve.errors import install_error_handlers


def app_raising(exc: BaseException) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/reef/boom")
    async def boom():
        raise exc

    return app


@pytest.mark.parametrize("exc, status", [
    (OSError(errno.ENOSPC, "No space left on device"), 507),
    (OperationalError("SELECT 1", {}, Exception("connection refused")), 503),
])
async def test_a_full_disk_and_a_store_gone_are_answered_and_not_raised_again(exc, status, caplog):
    transport = httpx.ASGITransport(app=app_raising(exc))  # raises what the app hands back to the server
    async with httpx.AsyncClient(transport=transport, base_url="http://reef") as client:
        r = await client.get("/reef/boom")
    assert r.status_code == status
    said = [rec for rec in caplog.records if rec.levelname == "ERROR"]
    assert len(said) == 1 and not said[0].exc_info


async def test_another_os_error_is_a_500_with_one_traceback_in_the_log(caplog):
    transport = httpx.ASGITransport(app=app_raising(OSError(errno.EACCES, "Permission denied")))
    async with httpx.AsyncClient(transport=transport, base_url="http://reef") as client:
        r = await client.get("/reef/boom")
    assert r.status_code == 500 and "Permission denied" not in r.text
    said = [rec for rec in caplog.records if rec.levelname == "ERROR"]
    assert len(said) == 1 and said[0].exc_info
