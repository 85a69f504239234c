"""The cold-start timeline: phases add up, unknown phases are refused, metrics are exported."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from loraplex.loader.timeline import Timeline


def test_phases_accumulate_and_export() -> None:
    tl = Timeline("test")
    tl.add("fetch", 0.5)
    tl.add("fetch", 0.25)
    with tl.phase("graph_capture"):
        pass
    total = tl.mark_ready()
    assert tl.seconds["fetch"] == 0.75 and total >= 0
    assert tl.summary().startswith("fetch=0.750s graph_capture=")
    value = REGISTRY.get_sample_value("loraplex_loader_phase_seconds", {"phase": "fetch"})
    assert value == 0.75
    with pytest.raises(ValueError, match="unknown phase"):
        tl.add("nap", 1.0)
