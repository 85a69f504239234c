"""A real engine reports its own cold start in `/state`: the phases it went through, in
order, within the wall time it took to be ready."""

from __future__ import annotations

from loraplex.loader.timeline import PHASES
from loraplex.platform.engine_spec.config import EngineConfig


def test_engine_state_reports_its_cold_start(tmp_path) -> None:
    from loraplex.bench._synthetic.models import save_tiny_model
    from loraplex.platform.engine.engine_core import EngineCore

    save_tiny_model(tmp_path / "m")
    core = EngineCore(EngineConfig(model=str(tmp_path / "m"), num_gpu_blocks=16))
    state = core.state()
    names = [p.name for p in state.cold_start]
    assert "header" in names and "fetch" in names  # read the folder, then its tensors
    assert "ready" not in names and names == [p for p in PHASES if p in names]
    total = state.cold_start_seconds
    assert total > 0
    assert sum(p.seconds for p in state.cold_start) <= total
    for p in state.cold_start:
        assert p.seconds >= 0 and p.start_s >= 0 and p.start_s + p.seconds <= total + 1e-6
    # the same as the engine's own timeline (what its /metrics exports)
    assert {p.name: p.seconds for p in state.cold_start} == {
        k: v for k, v in core.timeline.seconds.items() if k != "ready"
    }
