"""The expert-parallel backend matches the device: gloo for CPU tensors even where CUDA
exists, NCCL only for CUDA with one rank per GPU; too few GPUs is refused before any rank
is spawned."""

from __future__ import annotations

import pytest
import torch

from loraplex.moe import ep_launch


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """Pretend this host has `n` GPUs."""

    def set_count(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return set_count


def test_cpu_tensors_use_gloo_even_on_a_gpu_host(gpus) -> None:
    gpus(8)
    assert ep_launch.ep_backend("cpu", 4) == "gloo"


def test_cuda_uses_nccl_with_one_rank_per_gpu(gpus) -> None:
    gpus(4)
    assert ep_launch.ep_backend("cuda", 4) == "nccl"
    assert ep_launch.ep_backend("cuda:0", 2) == "nccl"


@pytest.mark.parametrize("count", [0, 2])
def test_more_ranks_than_gpus_is_refused_clearly(gpus, count: int) -> None:
    gpus(count)
    with pytest.raises(
        ValueError, match=f"needs 4 GPUs .one rank per GPU., but this host shows {count}"
    ):
        ep_launch.ep_backend("cuda", 4)


def test_the_ep_engine_refuses_before_spawning(gpus, monkeypatch: pytest.MonkeyPatch) -> None:
    from loraplex.platform.engine import ep_engine
    from loraplex.platform.engine_spec.config import EngineConfig

    gpus(1)
    spawned: list[object] = []
    monkeypatch.setattr(ep_engine.mp, "get_context", lambda *a: spawned.append(a))
    with pytest.raises(ValueError, match="one rank per GPU"):
        ep_engine.start_ep_engine(EngineConfig("unused", device="cuda"), 2)
    assert spawned == []


def test_unknown_devices_are_refused() -> None:
    with pytest.raises(ValueError, match="cpu or cuda"):
        ep_launch.ep_backend("meta", 2)
    with pytest.raises(ValueError, match="unknown device"):
        ep_launch.ep_backend("gpu-please", 2)
