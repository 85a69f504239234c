"""Celery task wrappers around the jobs; transient errors retry with backoff."""

from __future__ import annotations

import logging
import uuid

from celery import Celery, Task

from loraplex.platform.services.job_records import DELETE_OBJECTS, VALIDATE

from .delete import run_delete
from .dispatch import TASK_NAMES
from .validate import mark_transient_failure, run_validation

log = logging.getLogger(__name__)
MAX_RETRIES = 5


def _backoff(retries: int) -> int:
    return min(60, 2 ** (retries + 1))


def register_tasks(app: Celery) -> None:
    """Attach loraplex's tasks to `app`; each reads its Settings from `app.loraplex_settings`."""

    @app.task(
        name=TASK_NAMES[VALIDATE], bind=True, acks_late=True, max_retries=MAX_RETRIES, shared=False
    )
    def validate_adapter_version(self: Task, job_id: str) -> str:
        """Validate one adapter version (see loraplex.platform.jobs.validate)."""
        settings = self.app.loraplex_settings
        try:
            return run_validation(settings, uuid.UUID(job_id))
        except Exception as exc:
            final = self.request.retries >= MAX_RETRIES
            log.exception("validation job %s hit an error (final=%s)", job_id, final)
            mark_transient_failure(
                settings, uuid.UUID(job_id), f"{type(exc).__name__}: {exc}", final
            )
            if final:
                raise
            raise self.retry(exc=exc, countdown=_backoff(self.request.retries)) from exc

    @app.task(
        name=TASK_NAMES[DELETE_OBJECTS],
        bind=True,
        acks_late=True,
        max_retries=MAX_RETRIES,
        shared=False,
    )
    def delete_adapter_objects(self: Task, job_id: str) -> int:
        """Remove a deleted adapter's objects (see loraplex.platform.jobs.delete)."""
        try:
            return run_delete(self.app.loraplex_settings, uuid.UUID(job_id))
        except Exception as exc:
            if self.request.retries >= MAX_RETRIES:
                raise
            raise self.retry(exc=exc, countdown=_backoff(self.request.retries)) from exc
