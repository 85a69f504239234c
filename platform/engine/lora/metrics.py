"""Prometheus view of the multi-LoRA runtime: per-adapter residency, loads, evictions and
load time, plus vLLM's `lora_requests_info`, on the engine's own registry (`/metrics`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from loraplex.platform.engine.lora.runtime import LoraRuntime

P = "loraplex:"


class LoraCollector(Collector):
    """Reads `LoraRuntime.metrics()` at scrape time (no per-step bookkeeping)."""

    def __init__(self, runtime: LoraRuntime, model_name: str = "") -> None:
        self.runtime = runtime
        self.model_name = model_name

    def collect(self) -> Iterator[Any]:
        """One family per measure, one sample per adapter (labelled by its version key)."""
        m = self.runtime.metrics()
        labels = ["model_name", "adapter"]
        resident = GaugeMetricFamily(
            P + "lora_adapter_resident", "1 while the adapter is in device memory.", labels=labels
        )
        running = GaugeMetricFamily(
            P + "lora_adapter_running_requests", "Running requests per adapter.", labels=labels
        )
        loads = CounterMetricFamily(
            P + "lora_adapter_loads", "Copies of the adapter into device memory.", labels=labels
        )
        evictions = CounterMetricFamily(
            P + "lora_adapter_evictions",
            "Evictions of the adapter from device memory.",
            labels=labels,
        )
        fetch = GaugeMetricFamily(
            P + "lora_adapter_fetch_seconds",
            "Seconds the last fetch (storage -> host tier, validated) took.",
            labels=labels,
        )
        for key, a in m["adapters"].items():
            lv = [self.model_name, key]
            resident.add_metric(lv, 1.0 if a["resident"] else 0.0)
            running.add_metric(lv, float(a["running_requests"]))
            loads.add_metric(lv, float(a["loads"]))
            evictions.add_metric(lv, float(a["evictions"]))
            if a["fetch_seconds"] is not None:
                fetch.add_metric(lv, a["fetch_seconds"])
        yield from (resident, running, loads, evictions, fetch)
        lbl = ["model_name"]
        mem = GaugeMetricFamily(
            P + "lora_adapter_memory_used_bytes", "Device adapter memory in use.", labels=lbl
        )
        mem.add_metric([self.model_name], float(m["adapter_memory_used_bytes"]))
        cap = GaugeMetricFamily(
            P + "lora_adapter_memory_bytes", "Device adapter memory budget.", labels=lbl
        )
        cap.add_metric([self.model_name], float(m["adapter_memory_bytes"]))
        load_s = CounterMetricFamily(
            P + "lora_device_load_seconds",
            "Seconds spent copying adapters to the device.",
            labels=lbl,
        )
        load_s.add_metric([self.model_name], m["device_load_seconds"])
        policy = self.runtime.admission_policy
        info = GaugeMetricFamily(
            P + "lora_requests_info",
            "Running and waiting adapters (vLLM's lora_requests_info).",
            labels=["model_name", "running_lora_adapters", "waiting_lora_adapters", "max_lora"],
        )
        info.add_metric(
            [
                self.model_name,
                ",".join(sorted(policy.running)),
                ",".join(sorted(policy.waiting)),
                str(self.runtime.max_loras),
            ],
            1.0,
        )
        yield from (mem, cap, load_s, info)
