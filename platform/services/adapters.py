"""Tenant adapters: upload (direct or presigned multipart), list, look up, delete.

Every query filters by tenant; another tenant's adapter is NotFound. A new version number is
taken under a row lock on the adapter, so concurrent uploads to one name get distinct numbers.
Objects live under `tenants/{tenant_id}/adapters/{adapter_id}/v{n}/` (built by `object_keys`); a
failed upload removes its objects and its row, so nothing half-written stays behind. A row is
only ever removed after its objects: when object storage fails, the row stays `deleting`
(versions) or `deleted_at` (adapters), invisible to the tenant, and the reconciler retries.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any, BinaryIO

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, sessionmaker

from loraplex.adapters.validation import AdapterValidationError, parse_config, sniff_pickle
from loraplex.platform.db.models import Adapter, AdapterVersion, DraftAdapter
from loraplex.platform.db.session import rowcount, session_scope
from loraplex.platform.object_keys import adapter_prefix, adapter_version_prefix
from loraplex.platform.services import job_records as records
from loraplex.platform.services.job_records import JobDispatcher
from loraplex.platform.settings import Settings

from . import audit, objects
from .base_models import get_base_model
from .errors import Conflict, InvalidInput, NotFound, TooLarge, Unavailable
from .names import check_name
from .resolution_events import adapters_changed
from .upload_limits import reserve_upload

log = logging.getLogger(__name__)
MIN_PART = 8 << 20
MAX_PARTS = 10_000


@dataclass(frozen=True)
class Uploader:
    """Who is uploading and with what: the services an upload needs."""

    settings: Settings
    sessions: sessionmaker[Session]
    dispatcher: JobDispatcher
    tenant_id: uuid.UUID
    actor: str


def check_config(settings: Settings, raw: bytes | None) -> None:
    """Refuse a missing, oversized, non-JSON or unsupported adapter_config.json up front."""
    try:
        parse_config(raw, settings.max_config_bytes)
    except AdapterValidationError as exc:
        cls = TooLarge if exc.code == "config_too_large" else InvalidInput
        raise cls(exc.reason, code=exc.code, param="adapter_config") from None


def check_weights_size(settings: Settings, size: int) -> None:
    """Refuse empty or over-limit weight files."""
    if size > settings.max_adapter_bytes:
        raise TooLarge(
            f"adapter_model is {size} bytes; at most {settings.max_adapter_bytes} are allowed",
            code="file_too_large",
            param="adapter_model",
        )
    if size <= 0:
        raise InvalidInput(
            "adapter_model is empty", code="invalid_safetensors", param="adapter_model"
        )


def _reserve(up: Uploader, name: str, base_model: str, size: int) -> AdapterVersion:
    """Create the adapter if new and version n+1 in `uploading` (committed on return);
    refused (429) over the tenant's concurrent-upload or stored-bytes limit."""
    with session_scope(up.sessions) as session:
        base = get_base_model(session, base_model)
        reserve_upload(session, up.tenant_id, up.settings, size)
        session.execute(
            insert(Adapter)
            .values(
                id=uuid.uuid4(),
                tenant_id=up.tenant_id,
                name=name,
                base_model_id=base.id,
            )
            .on_conflict_do_nothing(
                index_elements=[Adapter.tenant_id, Adapter.name],
                index_where=Adapter.deleted_at.is_(None),
            )
        )
        adapter = session.scalars(
            select(Adapter)
            .where(
                Adapter.tenant_id == up.tenant_id,
                Adapter.name == name,
                Adapter.deleted_at.is_(None),
            )
            .with_for_update(of=Adapter)
        ).one()
        if adapter.base_model_id != base.id:
            raise Conflict(
                f"adapter {name!r} is over base model {adapter.base_model.name!r}; "
                f"a new version cannot change it to {base_model!r}",
                code="base_model_mismatch",
                param="base_model",
            )
        last = session.execute(
            select(func.max(AdapterVersion.n)).where(AdapterVersion.adapter_id == adapter.id)
        ).scalar_one()
        n = (last or 0) + 1
        version = AdapterVersion(
            id=uuid.uuid4(),
            tenant_id=up.tenant_id,
            adapter_id=adapter.id,
            n=n,
            object_prefix=adapter_version_prefix(up.tenant_id, adapter.id, n),
            status="uploading",
            bytes=size,  # declared; validation writes the real size
        )
        session.add(version)
        session.flush()
        return version


def _discard(up: Uploader, version: AdapterVersion) -> None:
    """Undo a reserved version: its objects, then its row (and the adapter if it has no
    other). If the objects cannot be removed now, the row stays `deleting` for the reconciler."""
    if not remove_version_objects(up.settings, version.object_prefix, version.s3_upload_id,
                                  version.weights_key):  # fmt: skip
        with session_scope(up.sessions) as session:
            session.execute(
                update(AdapterVersion)
                .where(AdapterVersion.id == version.id)
                .values(status="deleting", error="the upload was discarded")
            )
            _hide_adapter_if_nothing_else(session, version.adapter_id)
        return
    with session_scope(up.sessions) as session:
        drop_version_row(session, version.id, version.adapter_id)


def _hide_adapter_if_nothing_else(session: Session, adapter_id: uuid.UUID) -> None:
    """Mark the adapter deleted when every version it has is being deleted, so the tenant
    never sees an adapter that only a discarded upload created (the reconciler drops it)."""
    live = session.execute(
        select(func.count())
        .select_from(AdapterVersion)
        .where(AdapterVersion.adapter_id == adapter_id, AdapterVersion.status != "deleting")
    ).scalar_one()
    if live == 0:
        session.execute(
            update(Adapter)
            .where(Adapter.id == adapter_id, Adapter.deleted_at.is_(None))
            .values(deleted_at=func.now())
        )


def remove_version_objects(
    settings: Settings, prefix: str, s3_upload_id: str | None = None, key: str | None = None
) -> bool:
    """Abort the version's multipart upload and delete its objects; False if storage failed."""
    try:
        client = objects.s3_client(settings)
        if s3_upload_id and key:
            objects.abort_multipart(client, settings.s3_bucket, key, s3_upload_id)
        objects.delete_prefix(client, settings.s3_bucket, prefix)
    except Exception:  # noqa: BLE001 - any storage failure: keep the row, retry later
        log.warning("could not remove objects under %s; kept for retry", prefix, exc_info=True)
        return False
    return True


def drop_version_row(session: Session, version_id: uuid.UUID, adapter_id: uuid.UUID) -> None:
    """Delete a version's row, and its adapter's when no version is left."""
    session.execute(delete(AdapterVersion).where(AdapterVersion.id == version_id))
    # FOR UPDATE of the adapter row only: its eager-joined base model may not be locked.
    adapter = session.scalars(
        select(Adapter).where(Adapter.id == adapter_id).with_for_update(of=Adapter)
    ).one_or_none()
    if adapter is not None:
        left = session.execute(
            select(func.count())
            .select_from(AdapterVersion)
            .where(AdapterVersion.adapter_id == adapter.id)
        ).scalar_one()
        if left == 0:
            session.delete(adapter)


def _start_validation(
    up: Uploader, version: AdapterVersion, action: str, sha256: str | None = None
) -> AdapterVersion:
    """Move an `uploading` version to `validating` with a job (recording the weights' sha256
    when the upload computed it); send the job after commit."""
    with session_scope(up.sessions) as session:
        moved = rowcount(
            session.execute(
                update(AdapterVersion)
                .where(AdapterVersion.id == version.id, AdapterVersion.status == "uploading")
                .values(status="validating", s3_upload_id=None, sha256=sha256)
            )
        )
        if moved != 1:
            raise NotFound("the adapter was deleted during the upload", code="adapter_not_found")
        job = records.create_job(
            session, records.VALIDATE, tenant_id=up.tenant_id, subject_id=version.id
        )
        audit.record(
            session,
            actor=up.actor,
            action=action,
            resource_type="adapter_version",
            resource_id=version.id,
            tenant_id=up.tenant_id,
            detail={"n": version.n},
        )
        fresh = session.get(AdapterVersion, version.id, populate_existing=True)
        assert fresh is not None
    up.dispatcher.send(records.VALIDATE, job.id)
    return fresh


def check_files(
    settings: Settings, config_bytes: bytes | None, weights: BinaryIO, weights_size: int
) -> None:
    """What every uploaded adapter's files are checked for before anything is stored (an
    adapter or a draft adapter): the config, the weights' size, and no pickled weights."""
    check_config(settings, config_bytes)
    check_weights_size(settings, weights_size)
    weights.seek(0)
    pickled = sniff_pickle(weights.read(8))
    weights.seek(0)
    if pickled is not None:
        raise InvalidInput(
            f"adapter_model looks like pickled weights ({pickled}); pickle files "
            "are refused: upload adapter_model.safetensors",
            code="pickle_refused",
            param="adapter_model",
        )


def upload_adapter(
    up: Uploader,
    name: str,
    base_model: str,
    config_bytes: bytes | None,
    weights: BinaryIO,
    weights_size: int,
    weights_sha256: str | None = None,
) -> AdapterVersion:
    """Direct upload: checks what is cheap, stores both files, enqueues validation.

    The weights' sha256 is recorded on the version here, hashed while streaming them to
    storage (or `weights_sha256`, when the caller hashed the same file already): validation
    keeps it, and replicas check the bytes they fetch against it."""
    check_name(name, "name", up.settings.max_name_length)
    check_files(up.settings, config_bytes, weights, weights_size)
    version = _reserve(up, name, base_model, weights_size)
    try:
        client = objects.s3_client(up.settings)
        objects.put_bytes(client, up.settings.s3_bucket, version.config_key, config_bytes or b"")
        if weights_sha256 is None:
            weights_sha256, _ = objects.put_file_hashed(
                client, up.settings.s3_bucket, version.weights_key, weights
            )
        else:
            objects.put_file(client, up.settings.s3_bucket, version.weights_key, weights)
    except Exception as exc:
        _discard(up, version)
        raise storage_unavailable(exc) from exc
    try:
        return _start_validation(up, version, "adapter_version.upload", sha256=weights_sha256)
    except NotFound:
        remove_version_objects(up.settings, version.object_prefix)  # else: the reconciler
        raise


def storage_unavailable(exc: BaseException) -> Unavailable:
    """A 503 for a failed object-storage call; the storage error itself is only logged."""
    return Unavailable(
        "Object storage is unavailable right now; retry later.",
        code="storage_unavailable",
        detail=f"object storage: {type(exc).__name__}: {exc}",
    )


def part_plan(size: int) -> tuple[int, int]:
    """(part size, part count) for a multipart upload of `size` bytes."""
    part = max(MIN_PART, math.ceil(size / MAX_PARTS))
    return part, max(1, math.ceil(size / part))


def part_sizes(size: int, part_size: int) -> list[int]:
    """The exact byte count of each part (the last one takes the rest): each part's presigned
    URL signs its Content-Length, so no part can carry more than the declared total."""
    _, count = part_plan(size)
    return [min(part_size, size - i * part_size) for i in range(count)]


def start_presigned_upload(
    up: Uploader, name: str, base_model: str, config_bytes: bytes, size: int
) -> tuple[AdapterVersion, dict[str, Any]]:
    """Reserve a version, store its config, and presign the weights' multipart upload parts."""
    check_name(name, "name", up.settings.max_name_length)
    check_config(up.settings, config_bytes)
    check_weights_size(up.settings, size)
    version = _reserve(up, name, base_model, size)
    try:
        client = objects.s3_client(up.settings)
        bucket = up.settings.s3_bucket
        objects.put_bytes(client, bucket, version.config_key, config_bytes)
        upload_id = objects.start_multipart(client, bucket, version.weights_key)
        version.s3_upload_id = upload_id
        part_size, _count = part_plan(size)
        parts = objects.presign_parts(
            client,
            bucket,
            version.weights_key,
            upload_id,
            part_sizes(size, part_size),
            up.settings.presign_expiry_s,
        )
        with session_scope(up.sessions) as session:
            session.execute(
                update(AdapterVersion)
                .where(AdapterVersion.id == version.id)
                .values(s3_upload_id=upload_id)
            )
            audit.record(
                session,
                actor=up.actor,
                action="adapter_version.upload_start",
                resource_type="adapter_version",
                resource_id=version.id,
                tenant_id=up.tenant_id,
                detail={"n": version.n, "size": size},
            )
    except Exception as exc:
        _discard(up, version)
        raise storage_unavailable(exc) from exc
    plan = {"part_size": part_size, "parts": parts, "expires_in": up.settings.presign_expiry_s}
    return version, plan


def complete_presigned_upload(
    up: Uploader, name: str, upload_id: uuid.UUID, parts: list[tuple[int, str]]
) -> AdapterVersion:
    """Finish the multipart upload and start validation (a repeat returns the current state)."""
    with session_scope(up.sessions) as session:
        version = _version_by_id(session, up.tenant_id, name, upload_id)
        if version.status != "uploading":
            return version
        s3_upload_id = version.s3_upload_id
    if not s3_upload_id:
        raise Conflict("this upload has no multipart upload in progress", code="invalid_state")
    if not parts:
        raise InvalidInput("parts must list every uploaded part's number and ETag", param="parts")
    client = objects.s3_client(up.settings)
    bucket = up.settings.s3_bucket
    try:
        objects.complete_multipart(client, bucket, version.weights_key, s3_upload_id, parts)
    except Exception as exc:
        if objects.is_not_found(exc):
            raise Conflict(
                "the multipart upload is gone (expired or completed)", code="invalid_state"
            ) from None
        raise InvalidInput(
            "could not complete the multipart upload with these parts: give every uploaded "
            "part's number and ETag, in order",
            code="invalid_parts",
            param="parts",
            detail=f"complete_multipart: {type(exc).__name__}: {exc}",
        ) from None
    size = objects.object_size(client, bucket, version.weights_key) or 0
    if size > up.settings.max_adapter_bytes or size > (version.bytes or size):
        _discard(up, version)
        raise TooLarge(
            f"adapter_model is {size} bytes; at most {up.settings.max_adapter_bytes} are allowed",
            code="file_too_large",
            param="adapter_model",
        )
    return _start_validation(up, version, "adapter_version.upload_complete")


def _adapter(session: Session, tenant_id: uuid.UUID, name: str, *, lock: bool = False) -> Adapter:
    stmt = select(Adapter).where(
        Adapter.tenant_id == tenant_id, Adapter.name == name, Adapter.deleted_at.is_(None)
    )
    if lock:
        stmt = stmt.with_for_update(of=Adapter)
    adapter = session.scalars(stmt).one_or_none()
    if adapter is None:
        raise NotFound(f"no adapter named {name!r}", code="adapter_not_found")
    return adapter


def _version_by_id(
    session: Session, tenant_id: uuid.UUID, name: str, version_id: uuid.UUID
) -> AdapterVersion:
    adapter = _adapter(session, tenant_id, name)
    version = session.scalars(
        select(AdapterVersion).where(
            AdapterVersion.id == version_id,
            AdapterVersion.adapter_id == adapter.id,
            AdapterVersion.tenant_id == tenant_id,
        )
    ).one_or_none()
    if version is None:
        raise NotFound(f"no upload {version_id} for adapter {name!r}", code="upload_not_found")
    return version


def latest_version(session: Session, adapter: Adapter) -> AdapterVersion | None:
    """The adapter's newest version, whatever its status."""
    return session.scalars(
        select(AdapterVersion)
        .where(AdapterVersion.adapter_id == adapter.id)
        .order_by(AdapterVersion.n.desc())
        .limit(1)
    ).one_or_none()


def list_adapters(
    session: Session, tenant_id: uuid.UUID
) -> list[tuple[Adapter, AdapterVersion | None]]:
    """The tenant's adapters with their latest versions."""
    adapters = session.scalars(
        select(Adapter)
        .where(Adapter.tenant_id == tenant_id, Adapter.deleted_at.is_(None))
        .order_by(Adapter.name)
    ).all()
    return [(a, latest_version(session, a)) for a in adapters]


def get_adapter(
    session: Session, tenant_id: uuid.UUID, name: str
) -> tuple[Adapter, AdapterVersion | None]:
    """One of the tenant's adapters and its latest version."""
    adapter = _adapter(session, tenant_id, name)
    return adapter, latest_version(session, adapter)


def get_version(
    session: Session, tenant_id: uuid.UUID, name: str, n: int
) -> tuple[Adapter, AdapterVersion]:
    """Version `n` of one of the tenant's adapters."""
    adapter = _adapter(session, tenant_id, name)
    version = session.scalars(
        select(AdapterVersion).where(AdapterVersion.adapter_id == adapter.id, AdapterVersion.n == n)
    ).one_or_none()
    if version is None:
        raise NotFound(f"adapter {name!r} has no version {n}", code="version_not_found")
    return adapter, version


def delete_adapter(up: Uploader, name: str) -> tuple[Adapter, uuid.UUID]:
    """Delete the adapter: gone for the tenant now (its name free again), its rows kept as
    `deleting` until the job has removed the objects, then dropped."""
    with session_scope(up.sessions) as session:
        adapter = _adapter(session, up.tenant_id, name, lock=True)
        session.execute(
            update(Adapter)
            .where(Adapter.id == adapter.id, Adapter.tenant_id == up.tenant_id)
            .values(deleted_at=func.now())
        )
        session.execute(
            update(AdapterVersion)
            .where(AdapterVersion.adapter_id == adapter.id)
            .values(status="deleting")
        )
        mark_drafts_deleting(session, adapter_id=adapter.id)
        job = records.create_job(
            session,
            records.DELETE_OBJECTS,
            tenant_id=up.tenant_id,
            subject_id=adapter.id,
            payload={
                "prefix": adapter_prefix(up.tenant_id, adapter.id),
                "adapter_id": str(adapter.id),
            },
        )
        audit.record(
            session,
            actor=up.actor,
            action="adapter.delete",
            resource_type="adapter",
            resource_id=adapter.id,
            tenant_id=up.tenant_id,
            detail={"name": name},
        )
    adapters_changed(up.settings, up.tenant_id)
    up.dispatcher.send(records.DELETE_OBJECTS, job.id)
    return adapter, job.id


def mark_drafts_deleting(
    session: Session, *, version_id: uuid.UUID | None = None, adapter_id: uuid.UUID | None = None
) -> None:
    """Mark the draft adapters of one version, or of every version of one adapter, `deleting`
    (in the transaction deleting those): untied and uncounted at once; their objects go with
    the versions' folders and their rows with the versions' rows."""
    if (version_id is None) == (adapter_id is None):
        raise ValueError("name exactly one of version_id and adapter_id")
    versions = select(AdapterVersion.id).where(
        AdapterVersion.id == version_id
        if version_id is not None
        else AdapterVersion.adapter_id == adapter_id
    )
    session.execute(
        update(DraftAdapter)
        .where(DraftAdapter.adapter_version_id.in_(versions.scalar_subquery()))
        .values(status="deleting")
    )
