"""The cold-start timeline of a replica: how long each loading phase took, logged and exported.

Phases: header, fetch, device_copy, quantize, warmup, graph_capture, and ready (wall time from
the timeline's start). Durations go to the log and to Prometheus gauges; the bytes fetched and
retries go to counters. A rich progress bar shows bytes as they arrive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Gauge
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

log = logging.getLogger(__name__)

PHASES = ("header", "fetch", "device_copy", "quantize", "warmup", "graph_capture", "ready")

PHASE_SECONDS = Gauge(
    "loraplex_loader_phase_seconds",
    "Seconds spent in each phase of the last cold start of this process's replica.",
    ["phase"],
)
BYTES_FETCHED = Counter(
    "loraplex_loader_bytes_fetched_total", "Bytes of weights fetched from object storage."
)
RANGE_RETRIES = Counter(
    "loraplex_loader_range_retries_total", "Ranged GETs retried after a transient error."
)


class Timeline:
    """Accumulates phase durations (thread-safe) and reports them once the replica is ready."""

    def __init__(self, name: str = "replica") -> None:
        self.name = name
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.first_start: dict[str, float] = {}
        """Seconds from `started` to when each phase was first entered (its earliest interval)."""
        self.skipped: dict[str, str] = {}
        """Phases this start did not run, with why (e.g. graph capture on a CPU replica)."""
        self.counts: dict[str, int] = {}
        """What the start loaded, e.g. `weight_tensors` and `weight_bytes` handed to the model."""
        self._lock = threading.Lock()

    def add(self, phase: str, seconds: float) -> None:
        """Add `seconds` to `phase` (phases may be entered several times, from several threads)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; expected one of {PHASES}")
        began = max(0.0, time.perf_counter() - self.started - seconds)
        with self._lock:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
            self.first_start[phase] = min(self.first_start.get(phase, began), began)

    def skip(self, phase: str, reason: str) -> None:
        """Record that `phase` was not run this time, and why (shown in the summary)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; expected one of {PHASES}")
        with self._lock:
            self.skipped[phase] = reason

    def count(self, key: str, amount: int) -> None:
        """Add `amount` to the counter `key` (e.g. tensors or bytes of weights loaded)."""
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + int(amount)

    @contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        """Time a block of work as `phase`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - t0)

    def mark_ready(self) -> float:
        """Record the wall time from start to ready, log the timeline and export it; return it."""
        total = time.perf_counter() - self.started
        with self._lock:
            self.seconds["ready"] = total
        self.export()
        log.info("cold start of %s: %s", self.name, self.summary())
        return total

    def phases(self) -> list[tuple[str, float, float]]:
        """(phase, first start, seconds) of each recorded phase in phase order, `ready` left out
        (it is the total, `seconds["ready"]`)."""
        with self._lock:
            return [
                (p, self.first_start.get(p, 0.0), self.seconds[p])
                for p in PHASES
                if p in self.seconds and p != "ready"
            ]

    def summary(self) -> str:
        """One line: each recorded phase and its seconds, in phase order."""
        with self._lock:
            parts = [f"{p}={self.seconds[p]:.3f}s" for p in PHASES if p in self.seconds]
            parts += [f"{p}=skipped ({why})" for p, why in self.skipped.items()]
            parts += [f"{k}={v}" for k, v in self.counts.items()]
        return " ".join(parts)

    def export(self) -> None:
        """Set the Prometheus phase gauges to this timeline's values."""
        with self._lock:
            items = list(self.seconds.items())
        for phase, seconds in items:
            PHASE_SECONDS.labels(phase=phase).set(seconds)


def byte_progress(enabled: bool = True) -> Progress:
    """A rich progress bar for bytes (size, speed, time left); disabled -> it draws nothing."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )
