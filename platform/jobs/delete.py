"""The deletion job: remove every object under a deleted adapter's prefix (idempotent)."""

from __future__ import annotations

import uuid

from loraplex.platform.db.models import Job
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.services import job_records as records
from loraplex.platform.services import objects
from loraplex.platform.settings import Settings


def run_delete(settings: Settings, job_id: uuid.UUID) -> int:
    """Delete the objects under the job's prefix; returns how many were removed."""
    factory = make_sessionmaker(settings.database_url)
    with session_scope(factory) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or job.kind != records.DELETE_OBJECTS or job.status == "succeeded":
            return 0
        prefix = str((job.payload or {}).get("prefix", ""))
        if not prefix.startswith("tenants/"):
            records.finish(session, job, ok=False, error=f"refusing to delete under {prefix!r}")
            return 0
        job.status = "running"
        job.started_at = job.heartbeat_at = records.now()
        job.attempts = (job.attempts or 0) + 1
    removed = objects.delete_prefix(objects.s3_client(settings), settings.s3_bucket, prefix)
    with session_scope(factory) as session:
        job = session.get(Job, job_id)
        if job is not None:
            records.finish(session, job, ok=True, outcome={"removed": removed})
    return removed
