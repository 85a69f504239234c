"""Prometheus metrics of one gateway (its own registry, served at the API's `/metrics`):
time to first token as the client sees it, and the time requests spent waiting for a
starting replica (cold starts, scale from zero) with how each wait ended, and how many are
waiting now (what wakes a deployment scaled to zero: KEDA's activation trigger)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

P = "loraplex:gateway_"
WAIT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)

__all__ = ["CONTENT_TYPE_LATEST", "GatewayMetrics"]


class GatewayMetrics:
    """What the gateway measures per deployment."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.ttft = Histogram(
            P + "time_to_first_token_seconds",
            "From the request's arrival to its first token (cold-start waits included).",
            ["deployment"], registry=r, buckets=TTFT_BUCKETS,
        )  # fmt: skip
        self.cold_start_wait = Histogram(
            P + "cold_start_wait_seconds",
            "Time a request waited for a starting replica to become ready.",
            ["deployment", "outcome"], registry=r, buckets=WAIT_BUCKETS,
        )  # fmt: skip
        self.cold_start_timeouts = Counter(
            P + "cold_start_timeouts",
            "Requests refused (503) after waiting their deployment's cold_start_wait_s.",
            ["deployment"], registry=r,
        )  # fmt: skip
        self.requests_waiting = Gauge(
            P + "requests_waiting",
            "Requests held now for a replica of their deployment (cold start, scale from zero).",
            ["deployment"], registry=r,
        )  # fmt: skip

    @contextlib.contextmanager
    def waiting(self, deployment: str) -> Iterator[None]:
        """Count a request as held for `deployment` while the block runs."""
        gauge = self.requests_waiting.labels(deployment)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
