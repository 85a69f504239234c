"""The engine's cold-start timeline on its own `/metrics`: seconds per loading phase.

The loader's `Timeline` (header, fetch, device_copy, quantize, warmup, graph_capture, ready)
is recorded for every engine start, logged, and exported into the engine's registry, so the
replica's `/metrics` shows how its last start went; phases it skipped (graph capture on a CPU
replica) show as `loraplex:cold_start_phase_skipped 1`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from loraplex.loader.timeline import Timeline

P = "loraplex:"


class ColdStartMetrics:
    """Per-phase gauges of one engine's cold start, in the engine's registry."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name = model_name
        labels = ["model_name", "phase"]
        self.seconds = Gauge(
            P + "cold_start_phase_seconds",
            "Seconds spent in each phase of this engine's cold start (ready = wall time).",
            labels,
            registry=registry,
        )
        self.skipped = Gauge(
            P + "cold_start_phase_skipped",
            "1 for a cold-start phase this engine skipped (e.g. graph capture on CPU).",
            labels,
            registry=registry,
        )

    def record(self, timeline: Timeline) -> None:
        """Set the gauges to the timeline's phases."""
        for phase, seconds in timeline.seconds.items():
            self.seconds.labels(model_name=self.model_name, phase=phase).set(seconds)
        for phase in timeline.skipped:
            self.skipped.labels(model_name=self.model_name, phase=phase).set(1)


def finish_cold_start(timeline: Timeline, registry: CollectorRegistry, model_name: str) -> float:
    """Mark the engine ready (logs the timeline), export it on `registry`; return seconds."""
    total = timeline.mark_ready()
    ColdStartMetrics(registry, model_name).record(timeline)
    return total
