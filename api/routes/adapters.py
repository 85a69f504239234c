"""Tenant adapter API (Bearer tenant key): upload (multipart or presigned), list, get, delete.

Every lookup is scoped to the caller's tenant: another tenant's adapter is a 404.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any, BinaryIO

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from loraplex.platform.services import adapters as svc
from loraplex.platform.services.errors import InvalidInput, NotFound
from loraplex.platform.services.job_records import JobDispatcher
from loraplex.platform.services.upload_limits import check_upload_room
from loraplex.platform.settings import Settings

from .. import idempotent
from ..deps import (
    TenantCaller,
    get_db,
    get_dispatcher,
    get_sessions,
    get_settings,
    require_tenant,
    within_tenant_rate,
)
from ..response_models import (
    AdapterDeleted,
    AdapterList,
    AdapterOut,
    PresignedUpload,
    UploadAccepted,
    VersionOut,
)
from ..schemas import (
    PresignedUploadCreate,
    UploadComplete,
    adapter_view,
    upload_accepted_view,
    version_view,
)
from ..upload_gate import UploadGate

router = APIRouter(
    prefix="/v1/adapters", tags=["adapters"], dependencies=[Depends(within_tenant_rate)]
)

FORM_FIELDS = ("name", "base_model")
MAX_FIELD_BYTES = 4096


def _uploader(
    settings: Settings,
    sessions: sessionmaker[Session],
    dispatcher: JobDispatcher,
    caller: TenantCaller,
) -> svc.Uploader:
    return svc.Uploader(
        settings=settings,
        sessions=sessions,
        dispatcher=dispatcher,
        tenant_id=caller.tenant_id,
        actor=caller.actor,
    )


def _text_field(form: Any, field: str) -> str:
    value = form.get(field)
    if value is None:
        raise InvalidInput(
            f"the multipart field {field!r} is required", param=field, code="missing_field"
        )
    if not isinstance(value, str):
        raise InvalidInput(f"{field!r} must be a text field, not a file", param=field)
    return value


def _file_field(form: Any, field: str, required: bool = True) -> UploadFile | None:
    value = form.get(field)
    if value is None:
        if required:
            raise InvalidInput(
                f"the multipart file {field!r} is required", param=field, code="missing_file"
            )
        return None
    if not isinstance(value, UploadFile):
        raise InvalidInput(f"{field!r} must be a file part", param=field)
    return value


async def _config_bytes(form: Any, limit: int) -> bytes | None:
    value = form.get("adapter_config")
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8")
    return await value.read(limit + 1)


def _gate(request: Request, settings: Settings) -> UploadGate:
    gate = getattr(request.app.state, "upload_gate", None)
    if gate is None:
        gate = request.app.state.upload_gate = UploadGate(settings.max_spool_bytes)
    return gate


def _declared_size(request: Request, settings: Settings) -> int:
    """The body's declared length (the whole upload limit when it is sent chunked)."""
    try:
        declared = int(request.headers.get("content-length", ""))
    except ValueError:
        declared = -1
    most = settings.max_adapter_bytes + settings.max_config_bytes
    return declared if 0 <= declared <= most else most


def _sha256_file(fh: BinaryIO) -> str:
    fh.seek(0)
    digest = hashlib.sha256()
    for chunk in iter(lambda: fh.read(1 << 20), b""):
        digest.update(chunk)
    fh.seek(0)
    return digest.hexdigest()


def _check_room(
    sessions: sessionmaker[Session],
    tenant_id: uuid.UUID,
    settings: Settings,
    size: int,
    in_flight: int,
) -> None:
    with sessions() as session:
        check_upload_room(session, tenant_id, settings, size, in_flight)


@router.post("", status_code=202, response_model=UploadAccepted)
async def upload_adapter(
    request: Request,
    settings: Settings = Depends(get_settings),
    sessions: sessionmaker[Session] = Depends(get_sessions),
    dispatcher: JobDispatcher = Depends(get_dispatcher),
    caller: TenantCaller = Depends(require_tenant),
) -> JSONResponse:
    """Multipart upload of `adapter_config` + `adapter_model`: a new version, validated by a job."""
    ctype = request.headers.get("content-type", "")
    if not ctype.startswith("multipart/form-data"):
        raise InvalidInput(
            "upload with Content-Type multipart/form-data "
            "(fields name, base_model; files adapter_config, adapter_model)",
            code="invalid_content_type",
        )
    # Limits before the body: a tenant over them, or a full spool, costs no bytes read.
    size_bound = _declared_size(request, settings)
    gate = _gate(request, settings)
    await run_in_threadpool(
        _check_room,
        sessions,
        caller.tenant_id,
        settings,
        size_bound,
        gate.in_flight(caller.tenant_id),
    )
    with gate.receiving(caller.tenant_id, size_bound):
        async with request.form(max_files=4, max_fields=8, max_part_size=MAX_FIELD_BYTES) as form:
            name = _text_field(form, "name")
            base_model = _text_field(form, "base_model")
            config = await _config_bytes(form, settings.max_config_bytes)
            weights = _file_field(form, "adapter_model")
            assert weights is not None
            size = weights.size if weights.size is not None else 0
            up = _uploader(settings, sessions, dispatcher, caller)

            # The weights are hashed once: here for an idempotency fingerprint (the service
            # then records this digest), else by the service while it streams them to storage.
            digest: str | None = None

            def handler() -> dict[str, Any]:
                version = svc.upload_adapter(
                    up, name, base_model, config, weights.file, size, weights_sha256=digest
                )
                return upload_accepted_view(version, name)

            parts: tuple[Any, ...] = ()
            if request.headers.get(idempotent.HEADER) is not None:
                digest = await run_in_threadpool(_sha256_file, weights.file)
                parts = (name, base_model, hashlib.sha256(config or b"").hexdigest(), digest)
            return await idempotent.respond(
                request,
                sessions,
                scope=idempotent.tenant_scope(caller.tenant_id),
                tenant_id=caller.tenant_id,
                fingerprint_parts=parts,
                status=202,
                handler=handler,
            )


@router.post("/{name}/uploads", status_code=201, response_model=PresignedUpload)
async def start_upload(
    name: str,
    body: PresignedUploadCreate,
    request: Request,
    settings: Settings = Depends(get_settings),
    sessions: sessionmaker[Session] = Depends(get_sessions),
    dispatcher: JobDispatcher = Depends(get_dispatcher),
    caller: TenantCaller = Depends(require_tenant),
) -> JSONResponse:
    """Start a large upload: presigned S3 multipart part URLs for adapter_model.safetensors."""
    up = _uploader(settings, sessions, dispatcher, caller)
    config_bytes = json.dumps(body.adapter_config).encode("utf-8")

    def handler() -> dict[str, Any]:
        version, plan = svc.start_presigned_upload(
            up, name, body.base_model, config_bytes, body.size
        )
        base = str(request.url_for("complete_upload", name=name, upload_id=str(version.id)))
        return {
            **upload_accepted_view(version, name),
            "upload_id": str(version.id),
            **plan,
            "complete_url": base,
        }

    return await idempotent.respond(
        request,
        sessions,
        scope=idempotent.tenant_scope(caller.tenant_id),
        tenant_id=caller.tenant_id,
        fingerprint_parts=(name, body.model_dump()),
        status=201,
        handler=handler,
    )


@router.post(
    "/{name}/uploads/{upload_id}/complete",
    status_code=202,
    name="complete_upload",
    response_model=UploadAccepted,
)
async def complete_upload(
    name: str,
    upload_id: str,
    body: UploadComplete,
    request: Request,
    settings: Settings = Depends(get_settings),
    sessions: sessionmaker[Session] = Depends(get_sessions),
    dispatcher: JobDispatcher = Depends(get_dispatcher),
    caller: TenantCaller = Depends(require_tenant),
) -> JSONResponse:
    """Finish a presigned upload with the parts' ETags; validation starts."""
    try:
        uid = uuid.UUID(upload_id)
    except ValueError:
        raise NotFound(f"no upload {upload_id[:64]!r}", code="upload_not_found") from None
    up = _uploader(settings, sessions, dispatcher, caller)
    parts = [(p.part_number, p.etag) for p in body.parts]

    def handler() -> dict[str, Any]:
        version = svc.complete_presigned_upload(up, name, uid, parts)
        return upload_accepted_view(version, name)

    return await idempotent.respond(
        request,
        sessions,
        scope=idempotent.tenant_scope(caller.tenant_id),
        tenant_id=caller.tenant_id,
        fingerprint_parts=(name, upload_id, body.model_dump()),
        status=202,
        handler=handler,
    )


@router.get("", response_model=AdapterList)
def list_adapters(
    session: Session = Depends(get_db), caller: TenantCaller = Depends(require_tenant)
) -> dict[str, Any]:
    """The caller's adapters with their latest versions."""
    rows = svc.list_adapters(session, caller.tenant_id)
    return {"object": "list", "data": [adapter_view(a, v) for a, v in rows]}


@router.get("/{name}", response_model=AdapterOut)
def get_adapter(
    name: str, session: Session = Depends(get_db), caller: TenantCaller = Depends(require_tenant)
) -> dict[str, Any]:
    """One adapter and its latest version's status (and error, if it failed)."""
    adapter, latest = svc.get_adapter(session, caller.tenant_id, name)
    return adapter_view(adapter, latest)


@router.get("/{name}/versions/{n}", response_model=VersionOut)
def get_version(
    name: str,
    n: int,
    session: Session = Depends(get_db),
    caller: TenantCaller = Depends(require_tenant),
) -> dict[str, Any]:
    """One version of an adapter."""
    adapter, version = svc.get_version(session, caller.tenant_id, name, n)
    return version_view(adapter, version)


@router.delete("/{name}", status_code=202, response_model=AdapterDeleted)
def delete_adapter(
    name: str,
    settings: Settings = Depends(get_settings),
    sessions: sessionmaker[Session] = Depends(get_sessions),
    dispatcher: JobDispatcher = Depends(get_dispatcher),
    caller: TenantCaller = Depends(require_tenant),
) -> dict[str, Any]:
    """Delete the adapter and all its versions; a job removes the objects."""
    adapter, job_id = svc.delete_adapter(_uploader(settings, sessions, dispatcher, caller), name)
    return {
        "object": "adapter.deleted",
        "id": str(adapter.id),
        "name": name,
        "deleted": True,
        "job_id": str(job_id),
    }
