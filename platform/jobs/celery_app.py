"""The Celery application: broker from Settings, late acks so a killed worker's job re-runs."""

from __future__ import annotations

from celery import Celery

from loraplex.platform.settings import Settings


def create_celery(settings: Settings) -> Celery:
    """A Celery app bound to `settings` (broker, queue) with loraplex's tasks registered."""
    if not settings.broker_url:
        raise RuntimeError("LORAPLEX_BROKER_URL is not set: no Celery broker configured")
    app = Celery("loraplex", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=settings.celery_queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": max(60, settings.job_stale_after_s * 2)},
    )
    app.loraplex_settings = settings
    from .tasks import register_tasks

    register_tasks(app)
    return app
