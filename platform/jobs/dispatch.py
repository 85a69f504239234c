"""Sending jobs to the broker by task name, so senders (the API) need no task code."""

from __future__ import annotations

import logging
import uuid

from celery import Celery

from loraplex.platform.services.job_records import DELETE_OBJECTS, VALIDATE

log = logging.getLogger(__name__)

TASK_NAMES = {
    VALIDATE: "loraplex.validate_adapter_version",
    DELETE_OBJECTS: "loraplex.delete_adapter_objects",
}


class CeleryDispatcher:
    """A `services.job_records.JobDispatcher`: sends `job_id` to the task for `kind` on the configured queue."""

    def __init__(self, app: Celery, queue: str):
        self.app = app
        self.queue = queue

    def send(self, kind: str, job_id: uuid.UUID) -> None:
        """Enqueue; a broker outage is logged (the job row stays queued and is re-sent later)."""
        try:
            self.app.send_task(TASK_NAMES[kind], args=[str(job_id)], queue=self.queue)
        except Exception:  # noqa: BLE001 - the row is durable; recovery re-sends it
            log.exception(
                "could not enqueue %s job %s; it will be re-sent by recovery", kind, job_id
            )
