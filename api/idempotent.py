"""Run a creating request under an optional `Idempotency-Key`: replay, refuse or record."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from loraplex.platform.services import idempotency

HEADER = "idempotency-key"


async def respond(
    request: Request,
    sessions: sessionmaker[Session],
    *,
    scope: str,
    tenant_id: uuid.UUID | None,
    fingerprint_parts: tuple[Any, ...],
    status: int,
    handler: Callable[[], dict[str, Any]],
    redact: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> JSONResponse:
    """Call `handler` (in a thread) at most once per key; store its answer for replays."""
    key = request.headers.get(HEADER)
    if key is None:
        return JSONResponse(await run_in_threadpool(handler), status_code=status)
    fp = idempotency.fingerprint(request.method, request.url.path, *fingerprint_parts)
    stored = await run_in_threadpool(idempotency.begin, sessions, scope, key, fp, tenant_id)
    if stored is not None:
        return JSONResponse(
            stored.body, status_code=stored.status, headers={"Idempotent-Replayed": "true"}
        )
    try:
        body = await run_in_threadpool(handler)
    except BaseException:
        await run_in_threadpool(idempotency.release, sessions, scope, key)
        raise
    kept = redact(body) if redact else body
    await run_in_threadpool(idempotency.complete, sessions, scope, key, status, kept)
    return JSONResponse(body, status_code=status)


def tenant_scope(tenant_id: uuid.UUID) -> str:
    """Idempotency scope of a tenant."""
    return f"tenant:{tenant_id}"


ADMIN_SCOPE = "admin"
