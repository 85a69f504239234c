"""The audit log: one row per change, written in the same transaction as the change."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import event
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
    operator_id: uuid.UUID | None = None,
) -> None:
    """Add an audit row to the session (the caller commits it with the change);
    `operator_id` names the console operator when one did it."""
    session.add(
        AuditLog(
            tenant_id=tenant_id,
            actor=actor,
            operator_id=operator_id,
            action=action,
            resource_type=resource_type,
            resource_id=None if resource_id is None else str(resource_id),
            detail=detail or {},
        )
    )


def key_actor(api_key_id: uuid.UUID) -> str:
    """The actor string for a tenant API key."""
    return f"api_key:{api_key_id}"


def stamp_operator(session: Session, operator_id: uuid.UUID) -> None:
    """Every audit row this session writes from now on names `operator_id` (the console sets
    it once per request, so the services keep one `actor` argument)."""

    def _stamp(sess: Session, _ctx: Any, _instances: Any) -> None:
        for obj in sess.new:
            if isinstance(obj, AuditLog) and obj.operator_id is None:
                obj.operator_id = operator_id

    event.listen(session, "before_flush", _stamp)
