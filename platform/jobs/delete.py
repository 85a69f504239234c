"""The deletion job: remove every object under a deleted adapter's prefix, then its rows
(kept `deleting` until then, so a storage failure never leaves objects without a row).
Idempotent; a failure is retried by Celery and then re-sent by recovery."""

from __future__ import annotations

import uuid

from sqlalchemy import delete

from loraplex.platform.db.models import Adapter, Job
from loraplex.platform.db.session import session_scope
from loraplex.platform.jobs.sessions import job_sessions
from loraplex.platform.object_keys import is_adapter_key
from loraplex.platform.services import job_records as records
from loraplex.platform.services import objects
from loraplex.platform.settings import Settings


def run_delete(settings: Settings, job_id: uuid.UUID) -> int:
    """Delete the objects under the job's prefix; returns how many were removed."""
    factory = job_sessions(settings)
    with session_scope(factory) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or job.kind != records.DELETE_OBJECTS or job.status == "succeeded":
            return 0
        prefix = str((job.payload or {}).get("prefix", ""))
        adapter_id = (job.payload or {}).get("adapter_id")
        if not is_adapter_key(prefix):
            records.finish(session, job, ok=False, error=f"refusing to delete under {prefix!r}")
            return 0
        job.status = "running"
        job.started_at = job.heartbeat_at = records.now()
        job.attempts = (job.attempts or 0) + 1
    removed = objects.delete_prefix(objects.s3_client(settings), settings.s3_bucket, prefix)
    with session_scope(factory) as session:
        if adapter_id:  # its versions go with it (ON DELETE CASCADE)
            session.execute(
                delete(Adapter).where(
                    Adapter.id == uuid.UUID(adapter_id), Adapter.deleted_at.is_not(None)
                )
            )
        job = session.get(Job, job_id)
        if job is not None:
            records.finish(session, job, ok=True, outcome={"removed": removed})
    return removed
