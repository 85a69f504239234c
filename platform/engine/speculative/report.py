"""Speculation's acceptance per adapter as operators see it: the `/state` section and the
Prometheus counters of `/metrics` (vLLM's spec_decode names, with an `adapter` label: the
adapter version's key, "" for the base model).

The counters are read from the speculator's running totals at scrape time (a collector), so
a decode step pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loraplex.platform.engine.speculative.speculator import Speculator
from loraplex.platform.wire.messages import AdapterAcceptance, SpeculativeState

P = "loraplex:spec_decode_"


def speculative_state(
    spec: Speculator | None, draft_model: str | None = None
) -> SpeculativeState | None:
    """The `/state` section of a speculating engine (None when speculation is off)."""
    if spec is None:
        return None
    cfg = spec.config
    return SpeculativeState(
        method=cfg.method,
        k_min=cfg.k_min,
        k_max=cfg.k_max,
        draft_model=draft_model,
        acceptance=[
            AdapterAcceptance(
                adapter=key,
                verifications=st.verifications,
                drafted_tokens=st.drafted,
                accepted_tokens=st.accepted,
                mean_acceptance_length=float(st.mean_acceptance_length),
            )
            for key, st in sorted(spec.stats.items(), key=lambda kv: kv[0] or "")
        ],
    )


class AcceptanceCollector(Collector):
    """Per adapter: verifications (`num_drafts`), drafted and accepted tokens (counters) and
    the mean acceptance length (gauge), of whatever speculator `source` returns now."""

    def __init__(self, source: Callable[[], Speculator | None], model_name: str) -> None:
        self.source = source
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        """The metric families at this scrape (empty families while speculation is off)."""
        labels = ["model_name", "adapter"]
        drafts = CounterMetricFamily(
            P + "num_drafts", "Verifications of drafted tokens.", labels=labels
        )
        tokens = CounterMetricFamily(P + "num_draft_tokens", "Tokens drafted.", labels=labels)
        accepted = CounterMetricFamily(
            P + "num_accepted_tokens", "Drafted tokens accepted.", labels=labels
        )
        mean = GaugeMetricFamily(
            P + "mean_acceptance_length",
            "Tokens emitted per verification (accepted drafts plus the target's own).",
            labels=labels,
        )
        spec = self.source()
        if spec is not None:
            for key, st in list(spec.stats.items()):
                lv = [self.model_name, key or ""]
                drafts.add_metric(lv, st.verifications)
                tokens.add_metric(lv, st.drafted)
                accepted.add_metric(lv, st.accepted)
                mean.add_metric(lv, st.mean_acceptance_length)
        yield from (drafts, tokens, accepted, mean)
