"""Job rows: created in the caller's transaction, then moved queued -> running -> done; and
the `JobDispatcher` seam through which a committed job reaches the workers.

Services create jobs and hand them to a dispatcher they are given; the workers (`jobs/`,
above services) run them and implement the Celery dispatcher.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import update
from sqlalchemy.orm import Session

from loraplex.platform.db.models import Job

VALIDATE = "validate_adapter_version"
DELETE_OBJECTS = "delete_adapter_objects"
KINDS = (VALIDATE, DELETE_OBJECTS)


class JobDispatcher(Protocol):
    """Anything that can hand a committed job row to the workers."""

    def send(self, kind: str, job_id: uuid.UUID) -> None:
        """Enqueue the job; failures are logged, the stale-job recovery re-sends."""


def now() -> datetime:
    """The current time, timezone-aware (UTC)."""
    return datetime.now(UTC)


def create_job(
    session: Session,
    kind: str,
    *,
    tenant_id: uuid.UUID | None,
    subject_id: uuid.UUID | None = None,
    payload: dict[str, Any] | None = None,
) -> Job:
    """Add a queued job; dispatch it only after the transaction commits."""
    if kind not in KINDS:
        raise ValueError(f"unknown job kind {kind!r}")
    job = Job(
        id=uuid.uuid4(),
        tenant_id=tenant_id,
        kind=kind,
        subject_id=subject_id,
        status="queued",
        payload=payload or {},
        attempts=0,
    )
    session.add(job)
    session.flush()
    return job


def heartbeat(session: Session, job_id: uuid.UUID) -> None:
    """Show the job is alive (recovery requeues jobs whose heartbeat stops)."""
    session.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=now()))


def finish(
    session: Session,
    job: Job,
    *,
    ok: bool,
    error: str | None = None,
    outcome: dict[str, Any] | None = None,
) -> None:
    """Mark a job done (succeeded or failed) with its outcome."""
    job.status = "succeeded" if ok else "failed"
    job.error = error
    job.finished_at = now()
    if outcome:
        job.payload = {**(job.payload or {}), **outcome}
