"""Tenants: create, list, look up, and set their rate limits and monthly token quota."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from loraplex.platform.db.models import Adapter, Tenant

from . import audit
from .auth_events import mark_auth_changed
from .errors import Conflict, InvalidInput, NotFound
from .names import check_display_name

MAX_TENANT_NAME = 128
# Each limit's allowed range; None (NULL) means "the deployment default".
LIMIT_RANGES = {
    "requests_per_minute": (1, 2**31 - 1),
    "tokens_per_minute": (1, 2**62),
    "monthly_token_quota": (0, 2**62),
    "max_concurrent_uploads": (0, 10_000),
    "max_stored_adapter_bytes": (0, 2**62),
}


def check_limits(limits: Mapping[str, int | None]) -> dict[str, int | None]:
    """Validate limit fields (InvalidInput naming the bad one); returns them as a dict."""
    out: dict[str, int | None] = {}
    for field, value in limits.items():
        if field not in LIMIT_RANGES:
            raise InvalidInput(f"unknown limit {field!r}", code="invalid_limit", param=field)
        low, high = LIMIT_RANGES[field]
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
        ):
            raise InvalidInput(
                f"{field} must be an integer from {low} to {high}, or null for the default",
                code="invalid_limit",
                param=field,
            )
        out[field] = value
    return out


def create_tenant(
    session: Session,
    name: str,
    *,
    limits: Mapping[str, int | None] | None = None,
    actor: str = audit.ADMIN_ACTOR,
) -> Tenant:
    """Create a tenant with a unique name (Conflict if taken) and optional own limits."""
    check_display_name(name, "name", MAX_TENANT_NAME)
    own = check_limits(limits or {})
    stmt = insert(Tenant).values(id=uuid.uuid4(), name=name, **own).on_conflict_do_nothing()
    tenant_id = session.execute(stmt.returning(Tenant.id)).scalar_one_or_none()
    if tenant_id is None:
        raise Conflict(
            f"a tenant named {name!r} exists already", code="tenant_exists", param="name"
        )
    tenant = session.get(Tenant, tenant_id)
    assert tenant is not None
    audit.record(
        session,
        actor=actor,
        action="tenant.create",
        resource_type="tenant",
        resource_id=tenant.id,
        tenant_id=tenant.id,
        detail={"name": name, **own},
    )
    return tenant


def update_limits(
    session: Session,
    tenant_id: uuid.UUID,
    changes: Mapping[str, int | None],
    *,
    actor: str = audit.ADMIN_ACTOR,
) -> Tenant:
    """Set some of a tenant's limits (None: back to the default); the gateway applies them
    from the next request on, as it reads them with the API key."""
    if not changes:
        raise InvalidInput(
            f"nothing to change: send any of {', '.join(LIMIT_RANGES)}", code="empty_update"
        )
    values = check_limits(changes)
    tenant = session.get(Tenant, tenant_id, with_for_update=True)
    if tenant is None:
        raise NotFound(f"no tenant with id {tenant_id}", code="tenant_not_found")
    for field, value in values.items():
        setattr(tenant, field, value)
    mark_auth_changed(session)
    session.flush()
    audit.record(
        session,
        actor=actor,
        action="tenant.update_limits",
        resource_type="tenant",
        resource_id=tenant.id,
        tenant_id=tenant.id,
        detail=values,
    )
    return tenant


def list_tenants(session: Session) -> list[Tenant]:
    """Every tenant, oldest first."""
    return list(session.scalars(select(Tenant).order_by(Tenant.created_at, Tenant.name)))


def get_tenant(session: Session, tenant_id: uuid.UUID) -> Tenant:
    """The tenant with this id (NotFound otherwise)."""
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound(f"no tenant with id {tenant_id}", code="tenant_not_found")
    return tenant


def set_suspended(
    session: Session, tenant_id: uuid.UUID, suspended: bool, *, actor: str = audit.ADMIN_ACTOR
) -> Tenant:
    """Suspend a tenant (every one of its keys is refused with 403 `tenant_suspended` from
    the next request on: keys are checked against the tenant on each use) or lift it."""
    tenant = session.get(Tenant, tenant_id, with_for_update=True)
    if tenant is None:
        raise NotFound(f"no tenant with id {tenant_id}", code="tenant_not_found")
    if suspended == (tenant.suspended_at is not None):
        return tenant
    tenant.suspended_at = datetime.now(UTC) if suspended else None
    mark_auth_changed(session)
    session.flush()
    audit.record(
        session,
        actor=actor,
        action="tenant.suspend" if suspended else "tenant.unsuspend",
        resource_type="tenant",
        resource_id=tenant.id,
        tenant_id=tenant.id,
    )
    return tenant


def delete_tenant(session: Session, tenant_id: uuid.UUID, *, actor: str = audit.ADMIN_ACTOR) -> str:
    """Delete a tenant with its keys, jobs and usage; refused (Conflict) while it has adapters,
    so no stored object loses its row. Returns the deleted tenant's name."""
    tenant = session.get(Tenant, tenant_id, with_for_update=True)
    if tenant is None:
        raise NotFound(f"no tenant with id {tenant_id}", code="tenant_not_found")
    live = session.scalar(
        select(func.count()).select_from(Adapter).where(Adapter.tenant_id == tenant_id)
    )
    if live:
        raise Conflict(
            f"tenant {tenant.name!r} still has {live} adapter(s); delete them first",
            code="tenant_has_adapters",
        )
    name = tenant.name
    session.delete(tenant)
    mark_auth_changed(session)
    session.flush()
    audit.record(
        session,
        actor=actor,
        action="tenant.delete",
        resource_type="tenant",
        resource_id=tenant_id,
        detail={"name": name},
    )
    return name
