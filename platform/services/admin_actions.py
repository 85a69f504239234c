"""Operator actions on tenants' things that the tenant API does not offer: delete one
adapter version, retry a failed validation job."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from loraplex.platform.db.models import Adapter, AdapterVersion, Job
from loraplex.platform.services import job_records as records
from loraplex.platform.settings import Settings

from . import audit
from .adapters import drop_version_row, mark_drafts_deleting, remove_version_objects
from .errors import Conflict, NotFound, Unavailable
from .resolution_events import adapters_changed

# A version in these states may be deleted at once (validating / uploading ones have a job or
# a client still writing: wait for them to end).
DELETABLE = ("ready", "failed")


def _live_version(session: Session, version_id: uuid.UUID) -> tuple[AdapterVersion, Adapter]:
    row = session.execute(
        select(AdapterVersion, Adapter)
        .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
        .where(AdapterVersion.id == version_id, Adapter.deleted_at.is_(None))
        .with_for_update(of=AdapterVersion)
    ).one_or_none()
    if row is None:
        raise NotFound(f"no adapter version with id {version_id}", code="version_not_found")
    return row[0], row[1]


def mark_version_deleting(
    session: Session, version_id: uuid.UUID, *, actor: str
) -> tuple[uuid.UUID, str, uuid.UUID]:
    """Step 1 of deleting a version (in the caller's transaction): mark it `deleting` (no
    longer served) and audit it; returns (tenant id, object prefix, adapter id)."""
    version, adapter = _live_version(session, version_id)
    if version.status not in DELETABLE:
        raise Conflict(
            f"version {version.n} of {adapter.name!r} is {version.status}; "
            "wait until it is ready or failed",
            code="version_busy",
        )
    version.status = "deleting"
    mark_drafts_deleting(session, version_id=version.id)  # its draft adapters go with it
    audit.record(
        session,
        actor=actor,
        action="adapter_version.delete",
        resource_type="adapter_version",
        resource_id=version.id,
        tenant_id=version.tenant_id,
        detail={"adapter": adapter.name, "n": version.n},
    )
    return version.tenant_id, version.object_prefix, adapter.id


def finish_version_delete(
    settings: Settings,
    session: Session,
    version_id: uuid.UUID,
    tenant_id: uuid.UUID,
    prefix: str,
    adapter_id: uuid.UUID,
) -> None:
    """Step 2, after step 1 committed: remove the objects, then the row (kept `deleting`
    when storage fails, so no object is ever left without a row)."""
    adapters_changed(settings, tenant_id)
    if not remove_version_objects(settings, prefix):
        raise Unavailable(
            "object storage did not answer; the version stays marked deleting",
            code="storage_unavailable",
        )
    drop_version_row(session, version_id, adapter_id)


def retry_validation(session: Session, job_id: uuid.UUID, *, actor: str) -> Job:
    """Run a validation again whose job gave up on an infrastructure error (its version is
    still `validating`, its files still stored): a new job for the version, which the caller
    sends after commit. Only the version's newest job may be retried."""
    job = session.get(Job, job_id, with_for_update=True)
    if job is None:
        raise NotFound(f"no job with id {job_id}", code="job_not_found")
    if job.kind != records.VALIDATE or job.status != "failed" or job.subject_id is None:
        raise Conflict("only a failed validation job can be retried", code="job_not_retryable")
    version = session.get(AdapterVersion, job.subject_id)
    if version is None or version.status != "validating":
        raise Conflict(
            "the job's adapter version is no longer waiting for validation",
            code="job_not_retryable",
        )
    newer = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(Job.subject_id == job.subject_id, Job.created_at > job.created_at)
    )
    if newer:
        raise Conflict(
            "this version has a newer validation job; retry that one", code="job_not_retryable"
        )
    new = records.create_job(
        session, records.VALIDATE, tenant_id=job.tenant_id, subject_id=job.subject_id
    )
    audit.record(
        session,
        actor=actor,
        action="job.retry",
        resource_type="job",
        resource_id=new.id,
        tenant_id=job.tenant_id,
        detail={"retry_of": str(job.id)},
    )
    return new
