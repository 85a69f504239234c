"""`/state` carries the replica's cold-start timeline: it round-trips, stays strict, and a
document from a replica that does not report it still parses (empty timeline)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from loraplex.platform.wire import WIRE_VERSION, ColdStartPhase, ReplicaState

OLD_STATE = {
    "wire_version": WIRE_VERSION,
    "model_id": "m",
    "block_size": 16,
    "prefix_caching": True,
    "num_blocks": 8,
    "num_free_blocks": 8,
    "kv_cache_usage": 0.0,
    "num_requests_running": 0,
    "num_requests_waiting": 0,
    "resident_adapters": [],
    "max_loras": 4,
    "prefix_cache_queries": 0,
    "prefix_cache_hits": 0,
    "num_preemptions": 0,
}


def test_cold_start_round_trips() -> None:
    phases = [
        ColdStartPhase(name="header", start_s=0.0, seconds=0.01),
        ColdStartPhase(name="fetch", start_s=0.01, seconds=1.5),
    ]
    state = ReplicaState(**OLD_STATE, cold_start=phases, cold_start_seconds=1.75)
    back = ReplicaState.model_validate_json(state.model_dump_json())
    assert back == state and back.cold_start[1].name == "fetch"
    assert back.cold_start[1].seconds == 1.5 and back.cold_start_seconds == 1.75


def test_state_without_cold_start_parses() -> None:
    state = ReplicaState.model_validate_json(json.dumps(OLD_STATE))
    assert state.cold_start == [] and state.cold_start_seconds == 0.0


@pytest.mark.parametrize(
    "phase",
    [
        {"name": "fetch", "start_s": 0.0, "seconds": -1.0},
        {"name": "", "start_s": 0.0, "seconds": 1.0},
        {"name": "fetch", "start_s": 0.0, "seconds": 1.0, "bytes": 3},
        {"name": "fetch", "start_s": "soon", "seconds": 1.0},
    ],
)
def test_cold_start_phases_are_strict(phase: dict) -> None:
    with pytest.raises(ValidationError):
        ReplicaState.model_validate_json(json.dumps({**OLD_STATE, "cold_start": [phase]}))
