"""Draft adapters (issue 25): a tenant's small LoRA for a deployment's draft model, tied to one
of its adapter versions; the deployment's replicas draft that version's requests with it.

Uploaded like a version (config and weights checked up front, stored, then validated by the
validation job against the draft model, not the base), one per (target version, draft model).
The target is looked up among the caller's own adapters only: another tenant's adapter is a 404,
so no tenant can tie a draft adapter to it. Its files live in the target version's folder
(`.../v{n}/draft/{id}/`, built by `object_keys`) and its row goes with the version (ON DELETE
CASCADE); deleting the version or its adapter marks its draft adapters `deleting` at once
(`adapters.mark_drafts_deleting`), so they are neither tied nor counted while the objects go.
A row is removed only after its objects: when storage fails it stays `deleting` for the
reconciler (`jobs/reconcile.py`), which also collects a draft folder left without a row.
"""

from __future__ import annotations

import uuid
from typing import BinaryIO

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.models import AdapterVersion, Deployment, DraftAdapter
from loraplex.platform.db.session import rowcount, session_scope
from loraplex.platform.engine_spec.speculative import parse_speculative
from loraplex.platform.object_keys import draft_adapter_prefix
from loraplex.platform.services import job_records as records
from loraplex.platform.settings import Settings

from . import audit, objects
from .adapters import (
    Uploader,
    check_files,
    get_version,
    remove_version_objects,
    storage_unavailable,
)
from .errors import Conflict, InvalidInput, NotFound, Unavailable
from .resolution_events import adapters_changed
from .upload_limits import reserve_upload

DRAFT_JOB = "draft_adapter"  # the validation job's payload marks a draft adapter's job
LIVE = ("uploading", "validating", "ready")


def draft_model_of(session: Session, deployment: str, base_model_id: uuid.UUID) -> str:
    """The draft model of the deployment named `deployment`, which must serve the target's base
    model and run draft adapters (speculative method `draft_adapter`); a clear 4xx otherwise."""
    dep = session.scalars(select(Deployment).where(Deployment.name == deployment)).one_or_none()
    if dep is None:
        raise NotFound(f"no deployment named {deployment!r}", code="deployment_not_found",
                       param="deployment")  # fmt: skip
    if dep.base_model_id != base_model_id:
        raise InvalidInput(
            f"deployment {deployment!r} serves base model {dep.base_model.name!r}, not the "
            "adapter's: a draft adapter is tied to a deployment of its target's base model",
            code="base_model_mismatch",
            param="deployment",
        )
    option = parse_speculative(dep.speculative) if dep.speculative is not None else None
    if option is None or option.draft_model is None:
        how = "does not speculate" if option is None else f"speculates by {option.method!r}"
        raise InvalidInput(
            f"deployment {deployment!r} has no draft model ({how}): a draft adapter needs a "
            "deployment whose speculative method is 'draft_adapter'",
            code="no_draft_model",
            param="deployment",
        )
    if option.method != "draft_adapter":
        raise InvalidInput(
            f"deployment {deployment!r} runs its draft model without adapters (speculative "
            f"method {option.method!r}); draft adapters need method 'draft_adapter'",
            code="no_draft_adapters",
            param="deployment",
        )
    return option.draft_model


def _reserve(up: Uploader, name: str, n: int, deployment: str, size: int) -> DraftAdapter:
    """Check the target (the caller's own ready version) and the deployment, and add the
    draft adapter's row `uploading` (committed on return); a failed one is replaced."""
    with session_scope(up.sessions) as session:
        adapter, version = get_version(session, up.tenant_id, name, n)
        # Share-lock the target: a deletion of it (which marks its draft adapters) waits for
        # this row, or this upload sees the version `deleting` and is refused.
        status = session.execute(
            select(AdapterVersion.status)
            .where(AdapterVersion.id == version.id)
            .with_for_update(read=True)
        ).scalar_one()
        if status != "ready":
            raise Conflict(
                f"adapter {name!r} version {n} is {status}; a draft adapter is tied to "
                "a ready version",
                code="version_not_ready",
            )
        draft_model = draft_model_of(session, deployment, adapter.base_model_id)
        reserve_upload(session, up.tenant_id, up.settings, size)
        old = session.scalars(
            select(DraftAdapter).where(
                DraftAdapter.adapter_version_id == version.id,
                DraftAdapter.draft_model == draft_model,
            )
        ).one_or_none()
        if old is not None and old.status in LIVE:
            raise Conflict(
                f"adapter {name!r} version {n} already has a draft adapter for deployment "
                f"{deployment!r}'s draft model ({old.status}); delete it first",
                code="draft_adapter_exists",
            )
        if old is not None:  # failed or deleting: its objects are gone, or left to the
            # reconciler, which removes a draft folder without a row once past the grace period
            session.execute(delete(DraftAdapter).where(DraftAdapter.id == old.id))
        draft_id = uuid.uuid4()
        row = DraftAdapter(
            id=draft_id,
            tenant_id=up.tenant_id,
            adapter_version_id=version.id,
            draft_model=draft_model,
            object_prefix=draft_adapter_prefix(version.object_prefix, draft_id),
            status="uploading",
            bytes=size,
        )
        session.add(row)
        session.flush()
        session.expunge(row)
        return row


def upload_draft_adapter(
    up: Uploader,
    name: str,
    n: int,
    deployment: str,
    config_bytes: bytes | None,
    weights: BinaryIO,
    weights_size: int,
) -> DraftAdapter:
    """Store a draft adapter for the caller's adapter `name` version `n`, for deployment
    `deployment`'s draft model, and enqueue its validation (against that draft model)."""
    check_files(up.settings, config_bytes, weights, weights_size)
    row = _reserve(up, name, n, deployment, weights_size)
    try:
        client = objects.s3_client(up.settings)
        bucket = up.settings.s3_bucket
        objects.put_bytes(client, bucket, row.config_key, config_bytes or b"")
        sha256, _ = objects.put_file_hashed(client, bucket, row.weights_key, weights)
    except Exception as exc:
        _discard(up, row)
        raise storage_unavailable(exc) from exc
    job_id, fresh = _start_validation(up, row, sha256)
    up.dispatcher.send(records.VALIDATE, job_id)
    return fresh


def _discard(up: Uploader, row: DraftAdapter) -> None:
    """Undo a reserved draft adapter: its objects, then its row; when the objects cannot be
    removed now, the row stays `deleting` (with the reason) for the reconciler."""
    removed = remove_version_objects(up.settings, row.object_prefix)
    with session_scope(up.sessions) as session:
        if removed:
            session.execute(delete(DraftAdapter).where(DraftAdapter.id == row.id))
        else:
            session.execute(
                update(DraftAdapter)
                .where(DraftAdapter.id == row.id)
                .values(status="deleting", error="the upload was discarded")
            )


def _start_validation(
    up: Uploader, row: DraftAdapter, sha256: str
) -> tuple[uuid.UUID, DraftAdapter]:
    """`uploading` -> `validating` with a validation job (sent by the caller after commit)."""
    with session_scope(up.sessions) as session:
        moved = rowcount(
            session.execute(
                update(DraftAdapter)
                .where(DraftAdapter.id == row.id, DraftAdapter.status == "uploading")
                .values(status="validating", sha256=sha256)
            )
        )
        if moved != 1:
            raise NotFound("the adapter was deleted during the upload", code="adapter_not_found")
        job = records.create_job(
            session,
            records.VALIDATE,
            tenant_id=up.tenant_id,
            subject_id=row.id,
            payload={"subject": DRAFT_JOB},
        )
        audit.record(
            session,
            actor=up.actor,
            action="draft_adapter.upload",
            resource_type="draft_adapter",
            resource_id=row.id,
            tenant_id=up.tenant_id,
            detail={"adapter_version_id": str(row.adapter_version_id)},
        )
        fresh = session.get(DraftAdapter, row.id, populate_existing=True)
        assert fresh is not None
        session.expunge(fresh)
        return job.id, fresh


def list_draft_adapters(
    session: Session, tenant_id: uuid.UUID, name: str, n: int
) -> list[DraftAdapter]:
    """The draft adapters tied to the caller's adapter `name` version `n`, oldest first."""
    _, version = get_version(session, tenant_id, name, n)
    return list(
        session.scalars(
            select(DraftAdapter)
            .where(
                DraftAdapter.adapter_version_id == version.id,
                DraftAdapter.tenant_id == tenant_id,
            )
            .order_by(DraftAdapter.created_at)
        )
    )


def delete_draft_adapter(up: Uploader, name: str, n: int, draft_id: uuid.UUID) -> DraftAdapter:
    """Untie and remove one of the caller's draft adapters: replicas stop drafting with it at
    the target's next request; its objects, then its row, are removed now (the row stays
    `deleting` for the reconciler when storage fails)."""
    with session_scope(up.sessions) as session:
        _, version = get_version(session, up.tenant_id, name, n)
        row = session.scalars(
            select(DraftAdapter).where(
                DraftAdapter.id == draft_id,
                DraftAdapter.adapter_version_id == version.id,
                DraftAdapter.tenant_id == up.tenant_id,
            )
        ).one_or_none()
        if row is None:
            raise NotFound(f"no draft adapter {draft_id} for adapter {name!r} version {n}",
                           code="draft_adapter_not_found")  # fmt: skip
        _mark_deleting(session, row, up.actor)
        session.expunge(row)
    adapters_changed(up.settings, up.tenant_id)
    _drop_if_removed(up.settings, up.sessions, row)
    return row


def _mark_deleting(session: Session, row: DraftAdapter, actor: str) -> None:
    """Mark one draft adapter `deleting` (untied from now on) and audit it, in `session`."""
    session.execute(update(DraftAdapter).where(DraftAdapter.id == row.id).values(status="deleting"))
    audit.record(
        session,
        actor=actor,
        action="draft_adapter.delete",
        resource_type="draft_adapter",
        resource_id=row.id,
        tenant_id=row.tenant_id,
        detail={"adapter_version_id": str(row.adapter_version_id)},
    )


def _drop_if_removed(
    settings: Settings, sessions: sessionmaker[Session], row: DraftAdapter
) -> bool:
    """Remove a `deleting` draft adapter's objects, then its row; False (row kept) when
    storage failed."""
    if not remove_version_objects(settings, row.object_prefix):
        return False
    with session_scope(sessions) as session:
        session.execute(
            delete(DraftAdapter).where(DraftAdapter.id == row.id, DraftAdapter.status == "deleting")
        )
    return True


# An operator may delete a draft adapter in these states (uploading / validating ones have a
# client still writing or a job running: wait for them to end), as a version.
DELETABLE = ("ready", "failed")


def mark_draft_deleting(
    session: Session, adapter_id: uuid.UUID, draft_id: uuid.UUID, *, actor: str
) -> DraftAdapter:
    """An operator's step 1 of deleting draft adapter `draft_id` of adapter `adapter_id` (in
    the caller's transaction): marked `deleting` and audited. One not tied to a version of that
    adapter (another adapter's, another tenant's) is not found."""
    row = session.scalars(
        select(DraftAdapter)
        .join(AdapterVersion, AdapterVersion.id == DraftAdapter.adapter_version_id)
        .where(
            DraftAdapter.id == draft_id,
            AdapterVersion.adapter_id == adapter_id,
            DraftAdapter.tenant_id == AdapterVersion.tenant_id,
        )
        .with_for_update(of=DraftAdapter)
    ).one_or_none()
    if row is None:
        raise NotFound(f"adapter {adapter_id} has no draft adapter {draft_id}",
                       code="draft_adapter_not_found")  # fmt: skip
    if row.status not in DELETABLE:
        raise Conflict(
            f"draft adapter {draft_id} is {row.status}; wait until it is ready or failed",
            code="draft_adapter_busy",
        )
    _mark_deleting(session, row, actor)
    session.expunge(row)
    return row


def finish_draft_delete(
    settings: Settings, sessions: sessionmaker[Session], row: DraftAdapter
) -> None:
    """Step 2, after step 1 committed: its objects, then its row (kept `deleting`, and 503,
    when storage fails: the reconciler finishes it)."""
    adapters_changed(settings, row.tenant_id)
    if not _drop_if_removed(settings, sessions, row):
        raise Unavailable(
            "object storage did not answer; the draft adapter stays marked deleting",
            code="storage_unavailable",
        )


def ready_drafts(
    session: Session, version_ids: list[uuid.UUID]
) -> dict[uuid.UUID, list[DraftAdapter]]:
    """The ready draft adapters of these adapter versions (what the gateway ties to them)."""
    if not version_ids:
        return {}
    rows = session.scalars(
        select(DraftAdapter)
        .where(
            DraftAdapter.adapter_version_id.in_(version_ids),
            DraftAdapter.status == "ready",
            DraftAdapter.targets.is_not(None),
        )
        .order_by(DraftAdapter.created_at)
    )
    out: dict[uuid.UUID, list[DraftAdapter]] = {}
    for row in rows:
        out.setdefault(row.adapter_version_id, []).append(row)
    return out
