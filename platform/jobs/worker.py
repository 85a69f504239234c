"""`loraplex worker`: a Celery worker for loraplex's queue, plus a periodic recovery pass."""

from __future__ import annotations

import logging
import threading
import time

from loraplex.platform.settings import Settings

from .celery_app import create_celery
from .dispatch import CeleryDispatcher
from .reconcile import reconcile_objects
from .recovery import recover

log = logging.getLogger(__name__)


def _recovery_loop(settings: Settings, dispatcher: CeleryDispatcher, stop: threading.Event) -> None:
    interval = max(5.0, settings.job_stale_after_s / 2)
    # The reconciler lists the bucket: a few times per grace period is enough.
    reconcile_every = max(interval, min(3600.0, settings.orphan_grace_s / 4))
    next_reconcile = time.monotonic()
    while True:
        try:
            report = recover(settings, dispatcher)
            if report.requeued_versions or report.resent_jobs or report.expired_uploads:
                log.warning("recovery: %s", report)
        except Exception:  # noqa: BLE001 - keep the loop alive through outages
            log.exception("recovery pass failed")
        if time.monotonic() >= next_reconcile:
            next_reconcile = time.monotonic() + reconcile_every
            try:
                reconcile_objects(settings)
            except Exception:  # noqa: BLE001
                log.exception("reconciler pass failed")
        if stop.wait(interval):
            return


def run_worker(
    settings: Settings, *, concurrency: int = 1, pool: str = "solo", loglevel: str = "INFO"
) -> None:
    """Run the worker until it is stopped (Ctrl-C / SIGTERM); blocks."""
    app = create_celery(settings)
    dispatcher = CeleryDispatcher(app, settings.celery_queue)
    stop = threading.Event()
    thread = threading.Thread(
        target=_recovery_loop,
        args=(settings, dispatcher, stop),
        name="loraplex-recovery",
        daemon=True,
    )
    thread.start()
    try:
        worker = app.Worker(
            pool=pool,
            concurrency=concurrency,
            loglevel=loglevel,
            queues=[settings.celery_queue],
            without_gossip=True,
            without_mingle=True,
            without_heartbeat=True,
        )
        worker.start()
    finally:
        stop.set()


def main() -> None:
    """Entry point for `python -m loraplex.platform.jobs.worker` (settings from the env)."""
    logging.basicConfig(level=logging.INFO)
    run_worker(Settings())


if __name__ == "__main__":
    main()
