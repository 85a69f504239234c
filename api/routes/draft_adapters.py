"""Tenant draft adapter API (issue 25): a small LoRA for a deployment's draft model, tied to one of
the caller's adapter versions (`/v1/adapters/{name}/versions/{n}/drafts`): upload (multipart:
`deployment`, `adapter_config`, `adapter_model`), list, delete. Another tenant's adapter is a
404, like every tenant route."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from loraplex.platform.db.models import DraftAdapter
from loraplex.platform.services import draft_adapters as svc
from loraplex.platform.services.errors import InvalidInput, NotFound
from loraplex.platform.services.job_records import JobDispatcher
from loraplex.platform.settings import Settings

from ..deps import (
    TenantCaller,
    get_db,
    get_dispatcher,
    get_sessions,
    get_settings,
    require_tenant,
    within_tenant_rate,
)
from .adapters import (
    MAX_FIELD_BYTES,
    _check_room,
    _config_bytes,
    _declared_size,
    _file_field,
    _gate,
    _text_field,
    _uploader,
)

router = APIRouter(
    prefix="/v1/adapters", tags=["adapters"], dependencies=[Depends(within_tenant_rate)]
)


class DraftAdapterOut(BaseModel):
    """A draft adapter and its validation state (against `draft_model`)."""

    model_config = ConfigDict(extra="forbid")

    object: Literal["adapter.draft"]
    id: str
    name: str
    version: int
    draft_model: str
    status: str
    error: str | None
    sha256: str | None
    bytes: int | None
    rank: int | None
    alpha: float | None
    created_at: str | None


class DraftAdapterList(BaseModel):
    """The draft adapters of one adapter version."""

    model_config = ConfigDict(extra="forbid")

    object: Literal["list"]
    data: list[DraftAdapterOut]


def _version_number(n: str) -> int:
    """The version number of the path (a non-number names no version: 404)."""
    if not n.isdigit() or len(n) > 9:
        raise NotFound(f"no version {n[:16]!r}", code="version_not_found")
    return int(n)


def draft_view(row: DraftAdapter, name: str, n: int) -> dict[str, Any]:
    """A draft adapter as the API shows it."""
    return {
        "object": "adapter.draft",
        "id": str(row.id),
        "name": name,
        "version": n,
        "draft_model": row.draft_model,
        "status": row.status,
        "error": row.error,
        "sha256": row.sha256,
        "bytes": row.bytes,
        "rank": row.rank,
        "alpha": row.alpha,
        "created_at": row.created_at.isoformat() if row.created_at is not None else None,
    }


@router.post("/{name}/versions/{n}/drafts", status_code=202, response_model=DraftAdapterOut)
async def upload_draft_adapter(
    name: str,
    n: str,
    request: Request,
    settings: Settings = Depends(get_settings),
    sessions: sessionmaker[Session] = Depends(get_sessions),
    dispatcher: JobDispatcher = Depends(get_dispatcher),
    caller: TenantCaller = Depends(require_tenant),
) -> dict[str, Any]:
    """Multipart upload of a draft adapter for version `n` of adapter `name`, for the draft
    model of deployment `deployment`; validated by a job against that draft model."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InvalidInput(
            "upload with Content-Type multipart/form-data "
            "(field deployment; files adapter_config, adapter_model)",
            code="invalid_content_type",
        )
    number = _version_number(n)
    size_bound = _declared_size(request, settings)
    gate = _gate(request, settings)
    await run_in_threadpool(_check_room, sessions, caller.tenant_id, settings, size_bound,
                            gate.in_flight(caller.tenant_id))  # fmt: skip
    with gate.receiving(caller.tenant_id, size_bound):
        async with request.form(max_files=4, max_fields=8, max_part_size=MAX_FIELD_BYTES) as form:
            deployment = _text_field(form, "deployment")
            config = await _config_bytes(form, settings.max_config_bytes)
            weights = _file_field(form, "adapter_model")
            assert weights is not None
            size = weights.size if weights.size is not None else 0
            up = _uploader(settings, sessions, dispatcher, caller)
            row = await run_in_threadpool(
                svc.upload_draft_adapter, up, name, number, deployment, config, weights.file, size
            )
    return draft_view(row, name, number)


@router.get("/{name}/versions/{n}/drafts", response_model=DraftAdapterList)
def list_draft_adapters(
    name: str,
    n: str,
    session: Session = Depends(get_db),
    caller: TenantCaller = Depends(require_tenant),
) -> dict[str, Any]:
    """The draft adapters tied to version `n` of adapter `name`."""
    number = _version_number(n)
    rows = svc.list_draft_adapters(session, caller.tenant_id, name, number)
    return {"object": "list", "data": [draft_view(r, name, number) for r in rows]}


@router.delete("/{name}/versions/{n}/drafts/{draft_id}", response_model=DraftAdapterOut)
def delete_draft_adapter(
    name: str,
    n: str,
    draft_id: str,
    settings: Settings = Depends(get_settings),
    sessions: sessionmaker[Session] = Depends(get_sessions),
    dispatcher: JobDispatcher = Depends(get_dispatcher),
    caller: TenantCaller = Depends(require_tenant),
) -> dict[str, Any]:
    """Untie and remove a draft adapter (replicas draft that version's requests otherwise)."""
    number = _version_number(n)
    try:
        did = uuid.UUID(draft_id)
    except ValueError:
        raise NotFound(f"no draft adapter {draft_id[:64]!r}",
                       code="draft_adapter_not_found") from None  # fmt: skip
    up = _uploader(settings, sessions, dispatcher, caller)
    row = svc.delete_draft_adapter(up, name, number, did)
    return {**draft_view(row, name, number), "status": "deleted"}
