"""Rows the gateway end-to-end tests add directly (adapter versions marked ready)."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from sqlalchemy import func, select

from loraplex.platform.db.models import Adapter, AdapterVersion, BaseModel


def add_ready_adapter(
    session: Any,
    tenant_id: uuid.UUID,
    base_name: str,
    name: str,
    object_prefix: str | None = None,
    sha256: str | None = None,
) -> AdapterVersion:
    """A ready version of adapter NAME (no files behind it unless `object_prefix` has them)."""
    base = session.execute(select(BaseModel).where(BaseModel.name == base_name)).scalar_one()
    adapter = session.execute(
        select(Adapter).where(Adapter.tenant_id == tenant_id, Adapter.name == name)
    ).scalar_one_or_none()
    if adapter is None:
        adapter = Adapter(id=uuid.uuid4(), tenant_id=tenant_id, name=name, base_model_id=base.id)
        session.add(adapter)
        session.flush()
    n = (
        session.execute(
            select(func.max(AdapterVersion.n)).where(AdapterVersion.adapter_id == adapter.id)
        ).scalar()
        or 0
    ) + 1
    prefix = object_prefix or f"tenants/{tenant_id}/adapters/{adapter.id}/v{n}/"
    version = AdapterVersion(
        id=uuid.uuid4(),
        tenant_id=tenant_id,
        adapter_id=adapter.id,
        n=n,
        object_prefix=prefix,
        status="ready",
        sha256=sha256 or hashlib.sha256(prefix.encode()).hexdigest(),
    )
    session.add(version)
    session.flush()
    return version
