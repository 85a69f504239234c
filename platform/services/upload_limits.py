"""Per-tenant upload bounds: concurrent uploads in progress and stored adapter bytes.

Beside the gateway's RPM/TPM: each tenant's own limit where set (tenants table), else the
default from Settings. Checked when an upload reserves its version, under a lock on the
tenant row so two concurrent uploads cannot both slip under a limit; shown on `/v1/limits`.
Bytes count every version and draft adapter that holds objects (uploading at its declared
size, validating, ready): failed and deleting ones' objects are being removed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.models import AdapterVersion, DraftAdapter, Tenant
from loraplex.platform.settings import Settings

from .errors import LimitExceeded, NotFound

HOLDING_STATUSES = ("uploading", "validating", "ready")


@dataclass(frozen=True)
class UploadLimits:
    """A tenant's effective upload bounds."""

    max_concurrent_uploads: int
    max_stored_adapter_bytes: int


def upload_limits(tenant: Tenant, settings: Settings) -> UploadLimits:
    """The bounds for `tenant` (its own where set, else Settings)."""
    return UploadLimits(
        max_concurrent_uploads=(
            tenant.max_concurrent_uploads
            if tenant.max_concurrent_uploads is not None
            else settings.max_concurrent_uploads
        ),
        max_stored_adapter_bytes=(
            tenant.max_stored_adapter_bytes
            if tenant.max_stored_adapter_bytes is not None
            else settings.max_stored_adapter_bytes
        ),
    )


def upload_usage(session: Session, tenant_id: uuid.UUID) -> tuple[int, int]:
    """(uploads in progress, stored adapter bytes) of one tenant now: its adapter versions and
    its draft adapters (small LoRAs for a draft model, stored like any adapter) alike."""
    uploading = stored = 0
    for table in (AdapterVersion, DraftAdapter):
        count, total = session.execute(
            select(
                func.count().filter(table.status == "uploading"),
                func.coalesce(func.sum(table.bytes), 0),
            ).where(table.tenant_id == tenant_id, table.status.in_(HOLDING_STATUSES))
        ).one()
        # Neither is ever NULL (count, and a coalesced sum): `or 0` only tells the types so.
        uploading += int(count or 0)
        stored += int(total or 0)
    return uploading, stored


def reserve_upload(session: Session, tenant_id: uuid.UUID, settings: Settings, size: int) -> None:
    """Refuse (429) an upload of `size` bytes over either bound; call in the transaction that
    adds the `uploading` version (the tenant row stays locked until it commits)."""
    tenant = session.get(Tenant, tenant_id, with_for_update=True)
    if tenant is None:
        raise NotFound("no such tenant", code="tenant_not_found")
    limits = upload_limits(tenant, settings)
    uploading, stored = upload_usage(session, tenant_id)
    if uploading >= limits.max_concurrent_uploads:
        raise LimitExceeded(
            f"{uploading} uploads are already in progress; at most "
            f"{limits.max_concurrent_uploads} may run at once: complete or let one expire first",
            code="too_many_uploads",
        )
    if stored + size > limits.max_stored_adapter_bytes:
        raise LimitExceeded(
            f"storing {size} more bytes would bring your adapters to {stored + size} bytes, "
            f"over your limit of {limits.max_stored_adapter_bytes}: delete adapters you no "
            "longer need",
            code="storage_limit_exceeded",
            param="adapter_model",
        )


def check_upload_room(
    session: Session, tenant_id: uuid.UUID, settings: Settings, size: int, in_flight: int
) -> None:
    """Refuse (429) an upload of up to `size` bytes before its body is read, when the tenant
    already has too many uploads running (`in_flight` more are being received by this
    process) or no room for `size` bytes; `reserve_upload` checks again, under the lock,
    once the size is known."""
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound("no such tenant", code="tenant_not_found")
    limits = upload_limits(tenant, settings)
    uploading, stored = upload_usage(session, tenant_id)
    if uploading + in_flight >= limits.max_concurrent_uploads:
        raise LimitExceeded(
            f"{uploading + in_flight} uploads are already in progress; at most "
            f"{limits.max_concurrent_uploads} may run at once: complete or let one expire first",
            code="too_many_uploads",
        )
    if stored + size > limits.max_stored_adapter_bytes:
        raise LimitExceeded(
            f"this upload declares up to {size} bytes, and your adapters already hold "
            f"{stored} of your limit of {limits.max_stored_adapter_bytes}: delete adapters you "
            "no longer need",
            code="storage_limit_exceeded",
            param="adapter_model",
        )


def limits_view(session: Session, tenant: Tenant, settings: Settings) -> dict[str, Any]:
    """The upload part of `/v1/limits`."""
    limits = upload_limits(tenant, settings)
    uploading, stored = upload_usage(session, tenant.id)
    return {
        "concurrent_uploads": {
            "limit": limits.max_concurrent_uploads,
            "in_progress": uploading,
            "remaining": max(limits.max_concurrent_uploads - uploading, 0),
        },
        "stored_adapter_bytes": {
            "limit": limits.max_stored_adapter_bytes,
            "used": stored,
            "remaining": max(limits.max_stored_adapter_bytes - stored, 0),
        },
    }


def limits_view_for(
    sessions: sessionmaker[Session], tenant_id: uuid.UUID, settings: Settings
) -> dict[str, Any]:
    """`limits_view` in a session of its own (call it off the event loop); {} when the tenant
    is gone."""
    with sessions() as session:
        tenant = session.get(Tenant, tenant_id)
        return {} if tenant is None else limits_view(session, tenant, settings)
