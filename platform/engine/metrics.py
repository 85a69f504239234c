"""Prometheus metrics of one engine, vLLM-named under the `loraplex:` prefix.

Each engine gets its own CollectorRegistry, so several engines in one process (tests, the
benchmark) never clash and `/metrics` shows only this engine.
"""

from __future__ import annotations

from typing import TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

P = "loraplex:"
LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip

__all__ = ["CONTENT_TYPE_LATEST", "EngineMetrics"]


_Metric = TypeVar("_Metric", Counter, Gauge, Histogram)


class EngineMetrics:
    """Histograms, gauges and counters the engine updates every step."""

    def __init__(self, model_name: str = "") -> None:
        self.registry = CollectorRegistry()
        r, lbl = self.registry, ["model_name"]
        self.model_name = model_name

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(P + name, doc, lbl, registry=r, buckets=LATENCY_BUCKETS)

        self.ttft = hist("time_to_first_token_seconds", "Time to first token.")
        self.itl = hist("inter_token_latency_seconds", "Time between consecutive output tokens.")
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end request latency.")
        self.queue_time = hist("request_queue_time_seconds", "Time from arrival to first schedule.")
        self.running = Gauge(
            P + "num_requests_running", "Requests in the running batch.", lbl, registry=r
        )
        self.waiting = Gauge(
            P + "num_requests_waiting", "Requests waiting to be scheduled.", lbl, registry=r
        )
        self.kv_usage = Gauge(
            P + "kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).", lbl, registry=r
        )
        self.prefix_queries = Counter(
            P + "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            lbl,
            registry=r,
        )
        self.prefix_hits = Counter(
            P + "prefix_cache_hits", "Prompt tokens found in the prefix cache.", lbl, registry=r
        )
        self.preemptions = Counter(
            P + "num_preemptions", "Requests preempted (recompute).", lbl, registry=r
        )
        self.prompt_tokens = Counter(
            P + "prompt_tokens", "Prompt tokens processed.", lbl, registry=r
        )
        self.generation_tokens = Counter(
            P + "generation_tokens", "Tokens generated.", lbl, registry=r
        )
        self.finished = Counter(P + "request_success", "Finished requests by reason.", [*lbl, "finished_reason"], registry=r)  # fmt: skip
        self.memory_bytes = Gauge(
            P + "memory_bytes",
            "Device bytes held by the model's weights and by the KV cache.",
            [*lbl, "kind", "dtype"],
            registry=r,
        )
        self.kv_blocks = Gauge(
            P + "kv_cache_num_blocks", "KV-cache blocks allocated.", lbl, registry=r
        )
        self._seen = {"queries": 0, "hits": 0, "preemptions": 0}
        self._children: dict[int, object] = {}

    def set_memory(
        self, weight_bytes: int, weight_dtype: str, kv_bytes: int, kv_dtype: str, blocks: int
    ) -> None:
        """Record the replica's memory accounting (set once the cache is allocated)."""
        name = self.model_name
        self.memory_bytes.labels(model_name=name, kind="weights", dtype=weight_dtype).set(
            weight_bytes
        )
        self.memory_bytes.labels(model_name=name, kind="kv_cache", dtype=kv_dtype).set(kv_bytes)
        self.label(self.kv_blocks).set(blocks)

    def label(self, metric: _Metric) -> _Metric:
        """The metric's child for this engine's model (cached: `labels()` is not free)."""
        child = self._children.get(id(metric))
        if child is None:
            child = self._children[id(metric)] = metric.labels(model_name=self.model_name)
        return cast(_Metric, child)  # the child `labels()` gave for this very metric

    def update_totals(self, queries: int, hits: int, preemptions: int) -> None:
        """Advance the prefix-cache and preemption counters to the engine's running totals."""
        for key, total, metric in (
            ("queries", queries, self.prefix_queries),
            ("hits", hits, self.prefix_hits),
            ("preemptions", preemptions, self.preemptions),
        ):
            if total > self._seen[key]:
                self.label(metric).inc(total - self._seen[key])
                self._seen[key] = total

    def render(self) -> bytes:
        """The Prometheus text exposition of this engine's metrics."""
        return generate_latest(self.registry)
