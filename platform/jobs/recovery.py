"""Recovery: re-enqueue work a dead worker (or a lost message) left behind, and expire
abandoned uploads, so no version (nor draft adapter) is ever stuck in `validating` or
`uploading`.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from loraplex.platform.db.models import ADAPTER_WEIGHTS_FILE, AdapterVersion, DraftAdapter, Job
from loraplex.platform.db.session import session_scope
from loraplex.platform.jobs.sessions import job_sessions
from loraplex.platform.services import job_records as records
from loraplex.platform.services import objects
from loraplex.platform.services.draft_adapters import DRAFT_JOB
from loraplex.platform.services.job_records import JobDispatcher
from loraplex.platform.services.resolution_events import adapters_changed
from loraplex.platform.settings import Settings

from .validate import backfill_targets

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What one recovery pass did."""

    requeued_versions: list[uuid.UUID] = field(default_factory=list)
    resent_jobs: list[uuid.UUID] = field(default_factory=list)
    expired_uploads: list[uuid.UUID] = field(default_factory=list)
    backfilled_targets: list[uuid.UUID] = field(default_factory=list)


def _is_stale(job: Job | None, cutoff) -> bool:
    if job is None or job.status in ("succeeded", "failed"):
        return True
    if job.status == "queued":
        return job.created_at < cutoff and (job.heartbeat_at is None or job.heartbeat_at < cutoff)
    return (job.heartbeat_at or job.started_at or job.created_at) < cutoff


def _give_up_reason(session: Session, subject_id: uuid.UUID, attempts: int) -> str:
    """What the tenant reads: a stable reason code and the last job's id to report; the jobs'
    own errors (which may name hosts, buckets or keys) stay in the log and the operators'
    console under that id."""
    last_job = session.scalars(
        select(Job.id)
        .where(Job.kind == records.VALIDATE, Job.subject_id == subject_id)
        .order_by(Job.created_at.desc())
        .limit(1)
    ).first()
    reason = (
        f"validation did not finish after {attempts} attempts because of an error on the "
        "platform's side (reason: internal_error)"
    )
    return f"{reason}; report job {last_job}" if last_job else reason


def requeue_stale_validations(
    settings: Settings, dispatcher: JobDispatcher, older_than_s: float | None = None
) -> list[uuid.UUID]:
    """New validation jobs for `validating` versions and draft adapters whose latest job is
    dead or finished; one already tried `validation_max_attempts` times is failed instead,
    with a message."""
    limit = settings.job_stale_after_s if older_than_s is None else older_than_s
    sent: list[uuid.UUID] = []
    gave_up: list[tuple[uuid.UUID, str]] = []
    with session_scope(job_sessions(settings)) as session:
        cutoff = session.execute(select(func.now())).scalar_one() - timedelta(seconds=limit)
        rows: list[AdapterVersion | DraftAdapter] = [
            *session.scalars(
                select(AdapterVersion)
                .where(AdapterVersion.status == "validating")
                .with_for_update(skip_locked=True)
            ),
            *session.scalars(
                select(DraftAdapter)
                .where(DraftAdapter.status == "validating")
                .with_for_update(skip_locked=True)
            ),
        ]
        for row in rows:
            latest = session.scalars(
                select(Job)
                .where(Job.kind == records.VALIDATE, Job.subject_id == row.id)
                .order_by(Job.created_at.desc())
                .limit(1)
            ).one_or_none()
            if not _is_stale(latest, cutoff):
                continue
            if latest is not None and latest.status in ("queued", "running"):
                records.finish(session, latest, ok=False, error="stale: worker lost; requeued")
            attempts = session.execute(
                select(func.count())
                .select_from(Job)
                .where(Job.kind == records.VALIDATE, Job.subject_id == row.id)
            ).scalar_one()
            if attempts >= settings.validation_max_attempts:
                row.status = "failed"
                row.error = _give_up_reason(session, row.id, attempts)
                gave_up.append((row.tenant_id, row.object_prefix))
                continue
            job = records.create_job(
                session,
                records.VALIDATE,
                tenant_id=row.tenant_id,
                subject_id=row.id,
                # a draft adapter's job says so (the task runs the draft validation for it)
                payload={"requeued": True}
                | ({"subject": DRAFT_JOB} if isinstance(row, DraftAdapter) else {}),
            )
            sent.append(job.id)
    for tenant_id, prefix in gave_up:
        adapters_changed(settings, tenant_id)
        with contextlib.suppress(Exception):  # left to the orphan reconciler otherwise
            objects.delete_prefix(objects.s3_client(settings), settings.s3_bucket, prefix)
    for job_id in sent:
        dispatcher.send(records.VALIDATE, job_id)
    return sent


def resend_stale_deletes(
    settings: Settings, dispatcher: JobDispatcher, older_than_s: float | None = None
) -> list[uuid.UUID]:
    """Re-send deletion jobs that never finished."""
    limit = settings.job_stale_after_s if older_than_s is None else older_than_s
    with session_scope(job_sessions(settings)) as session:
        cutoff = session.execute(select(func.now())).scalar_one() - timedelta(seconds=limit)
        jobs = session.scalars(
            select(Job)
            .where(Job.kind == records.DELETE_OBJECTS, Job.status.in_(("queued", "running")))
            .with_for_update(skip_locked=True)
        ).all()
        ids = []
        for job in jobs:
            if _is_stale(job, cutoff):
                job.status = "queued"
                job.heartbeat_at = records.now()
                ids.append(job.id)
    for job_id in ids:
        dispatcher.send(records.DELETE_OBJECTS, job_id)
    return ids


def expire_abandoned_uploads(
    settings: Settings, older_than_s: float | None = None
) -> list[uuid.UUID]:
    """Fail `uploading` versions past the presign expiry (plus grace): abort their multipart
    upload and remove their objects (what storage refuses now, the reconciler removes later)."""
    limit = (
        settings.presign_expiry_s + settings.job_stale_after_s
        if older_than_s is None
        else older_than_s
    )
    with session_scope(job_sessions(settings)) as session:
        cutoff = session.execute(select(func.now())).scalar_one() - timedelta(seconds=limit)
        rows = session.execute(
            update(AdapterVersion)
            .where(AdapterVersion.status == "uploading", AdapterVersion.updated_at < cutoff)
            .values(status="failed", error="the upload was not completed in time")
            .returning(AdapterVersion.id, AdapterVersion.object_prefix, AdapterVersion.s3_upload_id)
        ).all()
    client = objects.s3_client(settings) if rows else None
    for _, prefix, upload_id in rows:
        try:
            if upload_id:
                key = prefix + ADAPTER_WEIGHTS_FILE
                objects.abort_multipart(client, settings.s3_bucket, key, upload_id)
            objects.delete_prefix(client, settings.s3_bucket, prefix)
        except Exception:  # noqa: BLE001 - the reconciler removes them later
            log.warning("could not remove expired upload under %s now", prefix, exc_info=True)
    return [r[0] for r in rows]


def recover(
    settings: Settings, dispatcher: JobDispatcher, older_than_s: float | None = None
) -> RecoveryReport:
    """One full recovery pass (the worker runs this at start and periodically)."""
    return RecoveryReport(
        requeued_versions=requeue_stale_validations(settings, dispatcher, older_than_s),
        resent_jobs=resend_stale_deletes(settings, dispatcher, older_than_s),
        expired_uploads=expire_abandoned_uploads(settings),
        backfilled_targets=backfill_targets(settings),
    )
