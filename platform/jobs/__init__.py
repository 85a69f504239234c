"""Background jobs on Celery: adapter validation, object deletion, stale-job recovery."""
