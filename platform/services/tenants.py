"""Tenants: create, list, look up."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from loraplex.platform.db.models import Tenant

from . import audit
from .errors import Conflict, NotFound
from .names import check_name

MAX_TENANT_NAME = 128


def create_tenant(session: Session, name: str, *, actor: str = audit.ADMIN_ACTOR) -> Tenant:
    """Create a tenant with a unique name (Conflict if taken)."""
    check_name(name, "name", MAX_TENANT_NAME)
    stmt = insert(Tenant).values(id=uuid.uuid4(), name=name).on_conflict_do_nothing()
    stmt = stmt.returning(Tenant.id)
    tenant_id = session.execute(stmt).scalar_one_or_none()
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
        detail={"name": name},
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
