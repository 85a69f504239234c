"""Compute dtype "auto": bf16 only where the device computes it natively, reported in /state;
adapter memory defaults to a budget of rank rows, with max_loras a cap."""

from __future__ import annotations

import torch

from loraplex.platform.engine.compute_dtype import auto_compute_dtype, cpu_flags
from loraplex.platform.engine_spec.config import EngineConfig


def test_auto_picks_bf16_only_with_native_support(tmp_path) -> None:
    assert auto_compute_dtype("cpu", {"avx2", "fma"}).dtype == torch.float32
    assert auto_compute_dtype("cpu", {"avx2", "avx512_bf16"}).dtype == torch.bfloat16
    got = auto_compute_dtype("cpu", {"amx_bf16"})
    assert got.dtype == torch.bfloat16 and got.name == "bfloat16" and "native" in got.reason
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n")
    assert cpu_flags(info) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()


def test_auto_engine_reports_its_dtype_in_state(tmp_path) -> None:
    from loraplex.bench._synthetic.models import save_tiny_model
    from loraplex.platform.engine.engine_core import EngineCore

    save_tiny_model(tmp_path / "m")
    core = EngineCore(EngineConfig(model=str(tmp_path / "m"), dtype="auto", num_gpu_blocks=16))
    want = auto_compute_dtype("cpu")
    state = core.state()
    assert state.compute_dtype == want.name and state.compute_dtype_reason == want.reason
    assert next(core.model.parameters()).dtype == want.dtype
    plain = EngineCore(EngineConfig(model=str(tmp_path / "m"), num_gpu_blocks=16)).state()
    assert plain.compute_dtype == "float32" and plain.compute_dtype_reason == "asked for"


def test_adapter_memory_is_a_rank_row_budget() -> None:
    cfg = EngineConfig(model="m")
    assert cfg.max_loras == 256
    assert cfg.adapter_rank_rows() == 2048  # 256 rank-8 adapters resident by default
    assert EngineConfig(model="m", max_loras=2, max_lora_rank=8).adapter_rank_rows() == 16
    assert EngineConfig(model="m", adapter_memory_rank_rows=8).adapter_rank_rows() == 64
