"""Request dependencies: settings, DB sessions, job dispatch, admin and tenant authentication."""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.session import session_scope
from loraplex.platform.errors import HttpError
from loraplex.platform.services import audit
from loraplex.platform.services.api_keys import use_api_key
from loraplex.platform.services.job_records import JobDispatcher
from loraplex.platform.settings import Settings

ADAPTERS_SCOPE = "adapters"


@dataclass(frozen=True)
class TenantCaller:
    """An authenticated tenant request: whose, through which key."""

    tenant_id: uuid.UUID
    api_key_id: uuid.UUID
    requests_per_minute: int | None = None  # the tenant's own limit (None: the default)

    @property
    def actor(self) -> str:
        """The audit-log actor for this caller."""
        return audit.key_actor(self.api_key_id)


def get_settings(request: Request) -> Settings:
    """The app's Settings."""
    return request.app.state.settings


def get_sessions(request: Request) -> sessionmaker[Session]:
    """The app's session factory (503 when no database is configured)."""
    sessions = getattr(request.app.state, "sessions", None)
    if sessions is None:
        raise HttpError(
            503, "No database is configured (LORAPLEX_DATABASE_URL).", code="database_unavailable"
        )
    return sessions


def get_db(sessions: sessionmaker[Session] = Depends(get_sessions)) -> Iterator[Session]:
    """One transaction per request: committed when the handler returns, rolled back on error."""
    with session_scope(sessions) as session:
        yield session


def get_dispatcher(request: Request) -> JobDispatcher:
    """The job dispatcher (503 when no broker is configured)."""
    dispatcher = getattr(request.app.state, "dispatcher", None)
    if dispatcher is None:
        raise HttpError(
            503, "No job broker is configured (LORAPLEX_BROKER_URL).", code="broker_unavailable"
        )
    return dispatcher


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise HttpError(
            401,
            "You didn't provide an API key. Pass it as `Authorization: Bearer KEY`.",
            code="missing_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return token


def require_admin(request: Request) -> str:
    """Admin routes: the bearer token must be the admin key."""
    token = _bearer(request)
    admin_key = get_settings(request).admin_key
    if not admin_key:
        raise HttpError(
            403, "The admin API is disabled: no admin key is configured.", code="admin_disabled"
        )
    if not hmac.compare_digest(token.encode(), admin_key.encode()):
        raise HttpError(
            401,
            "Incorrect admin key provided.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return audit.ADMIN_ACTOR


async def require_tenant(
    request: Request, sessions: sessionmaker[Session] = Depends(get_sessions)
) -> TenantCaller:
    """Tenant routes: a live API key with the `adapters` scope. Verified through the gateway's
    key cache where there is one (a known key costs no query, so a flood of refused uploads
    costs no database transaction each; a revocation or suspension still applies at once),
    else in the database, off the event loop."""
    token = _bearer(request)
    gw = getattr(request.app.state, "gateway", None)
    if gw is not None:
        use = await gw.key_use(token)
    else:
        use = await run_in_threadpool(use_api_key, sessions, token)
    if use is None:
        raise HttpError(
            401,
            "Incorrect or revoked API key provided.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if ADAPTERS_SCOPE not in use.scopes:
        raise HttpError(403, "This API key has no `adapters` scope.", code="insufficient_scope")
    return TenantCaller(
        tenant_id=use.tenant_id,
        api_key_id=use.key_id,
        requests_per_minute=use.requests_per_minute,
    )


async def within_tenant_rate(
    request: Request, caller: TenantCaller = Depends(require_tenant)
) -> None:
    """The adapter API counts the tenant's requests per minute too, in a budget of its own
    (managing adapters never spends inference's), before any work; a refusal is a 429 after
    the tenant's pause (`gateway/refusal_pause.py`). Without the gateway (no Redis) there
    are no rate limits, as inference is off then."""
    gw = getattr(request.app.state, "gateway", None)
    if gw is None:
        return
    rpm = caller.requests_per_minute
    rpm = rpm if rpm is not None else gw.settings.rate_limit_rpm
    tenant = str(caller.tenant_id)
    await gw.refusals.paused(tenant, gw.api_limiter.admit_request(tenant, rpm))
