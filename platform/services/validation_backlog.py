"""The adapter validation backlog as Prometheus text: how many versions are still
`validating` and how long the oldest has waited, read from the database (what the
`LoraplexValidationBacklog` alert watches: a stuck or starved worker pool). Each API pod
serves it on `/metrics`; a short cache keeps scrapes from reaching the database each time."""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.db.models import AdapterVersion

CACHE_S = 5.0
P = "loraplex:adapter_validation_"


class ValidationBacklog:
    """The backlog's gauges over one database, refreshed at most every `CACHE_S` seconds."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self.registry = r = CollectorRegistry()
        self.count = Gauge(P + "backlog", "Adapter versions still validating.", registry=r)
        self.oldest = Gauge(
            P + "oldest_seconds",
            "How long the oldest version still validating has waited (0 when none).",
            registry=r,
        )
        self._lock = threading.Lock()
        self._read_at = float("-inf")

    def refresh(self) -> None:
        """Read the backlog from the database (the age by its clock, not this pod's)."""
        age = func.extract("epoch", func.now() - func.min(AdapterVersion.created_at))
        query = select(func.count(), age).where(AdapterVersion.status == "validating")
        with self.sessions() as session:
            count, oldest = session.execute(query).one()
        self.count.set(count)
        self.oldest.set(float(oldest or 0.0))

    def render(self) -> bytes:
        """The gauges' Prometheus text, read again when the last read is `CACHE_S` old."""
        with self._lock:
            if time.monotonic() - self._read_at >= CACHE_S:
                self.refresh()
                self._read_at = time.monotonic()
            return generate_latest(self.registry)
