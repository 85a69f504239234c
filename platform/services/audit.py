"""The audit log: one row per change, written in the same transaction as the change."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from loraplex.platform.db.models import AuditLog

ADMIN_ACTOR = "admin"


def record(
    session: Session,
    *,
    actor: str,
    action: str,
    resource_type: str,
    resource_id: str | uuid.UUID | None = None,
    tenant_id: uuid.UUID | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """Add an audit row to the session (the caller commits it with the change)."""
    session.add(
        AuditLog(
            tenant_id=tenant_id,
            actor=actor,
            action=action,
            resource_type=resource_type,
            resource_id=None if resource_id is None else str(resource_id),
            detail=detail or {},
        )
    )


def key_actor(api_key_id: uuid.UUID) -> str:
    """The actor string for a tenant API key."""
    return f"api_key:{api_key_id}"
