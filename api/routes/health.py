"""`GET /healthz`: the API is up and its database answers; `GET /metrics`: the gateway's
Prometheus metrics (time to first token, cold-start waits) and the adapter validation backlog."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from loraplex.platform.gateway.metrics import CONTENT_TYPE_LATEST
from loraplex.platform.http_errors import error_response
from loraplex.platform.services.validation_backlog import ValidationBacklog

router = APIRouter(tags=["health"])


def _ping(request: Request) -> None:
    sessions = getattr(request.app.state, "sessions", None)
    if sessions is None:
        raise RuntimeError("no database configured")
    with sessions() as session:
        session.execute(text("SELECT 1"))


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    """200 with `{"status": "ok"}` when the database answers, else 503."""
    try:
        await run_in_threadpool(_ping, request)
    except Exception as exc:  # noqa: BLE001 - any failure means unhealthy
        return error_response(
            503,
            f"database unavailable: {type(exc).__name__}",
            code="database_unavailable",
            type="server_error",
        )
    return JSONResponse({"status": "ok"})


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}}},
)
async def metrics(request: Request) -> Response:
    """The gateway's metrics (Prometheus text); empty when inference is not configured."""
    gw = getattr(request.app.state, "gateway", None)
    body = gw.router.metrics.render() if gw is not None else b""
    sessions = getattr(request.app.state, "sessions", None)
    if sessions is not None:
        backlog = getattr(request.app.state, "validation_backlog", None)
        if backlog is None:
            backlog = request.app.state.validation_backlog = ValidationBacklog(sessions)
        body += await run_in_threadpool(backlog.render)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
