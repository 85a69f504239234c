"""The cold-start timeline: phases add up, unknown phases are refused, metrics are exported."""

from __future__ import annotations

import time

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


def test_phases_have_their_first_start_in_phase_order() -> None:
    tl = Timeline("test")
    with tl.phase("header"):
        time.sleep(0.02)
    with tl.phase("fetch"):
        time.sleep(0.02)
    with tl.phase("header"):  # entered again later: its start stays the first one
        pass
    tl.mark_ready()
    phases = tl.phases()
    assert [p[0] for p in phases] == ["header", "fetch"]  # phase order, `ready` left out
    (_, h_start, h_s), (_, f_start, f_s) = phases
    assert h_start < 0.01 and h_s >= 0.02
    assert f_start >= h_start + 0.02 and f_s >= 0.02
    assert f_start + f_s <= tl.seconds["ready"]
