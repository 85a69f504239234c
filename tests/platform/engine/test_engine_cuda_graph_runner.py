"""CUDA graph capture of a decode step: size planning everywhere, capture and replay on a GPU only."""

from __future__ import annotations

import pytest
import torch

from loraplex.loader.timeline import Timeline
from loraplex.platform.engine.cuda_graphs import (
    CudaGraphRunner,
    GraphInput,
    default_capture_sizes,
    pad_to_captured,
    time_step,
)


def test_default_capture_sizes_are_vllm_style_largest_first() -> None:
    assert default_capture_sizes(1) == [1]
    assert default_capture_sizes(6) == [6, 4, 2, 1]
    assert default_capture_sizes(32) == [32, 24, 16, 8, 4, 2, 1]
    with pytest.raises(ValueError):
        default_capture_sizes(0)


def test_live_batches_pad_to_the_next_captured_size() -> None:
    sizes = [16, 8, 4, 2, 1]
    assert [pad_to_captured(n, sizes) for n in (1, 2, 3, 5, 8, 9, 16)] == [1, 2, 4, 8, 8, 16, 16]
    assert pad_to_captured(17, sizes) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")
def test_without_cuda_graphs_are_skipped_not_faked() -> None:
    assert CudaGraphRunner.available() is False
    runner = CudaGraphRunner(lambda x: x * 2, [GraphInput("x", (4,), torch.float32)], [2, 1])
    with pytest.raises(RuntimeError, match="CUDA"):
        runner.capture()
    assert not runner.captured
    x = torch.ones(3, 4)
    assert torch.equal(runner.run(x), x * 2)  # uncaptured: the step simply runs eager


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_replay_matches_eager_with_padding_on_gpu() -> None:
    torch.manual_seed(0)
    hidden, vocab, slots = 64, 128, 4
    dev = torch.device("cuda")
    w1 = torch.randn(hidden, hidden, device=dev) / 8
    w2 = torch.randn(vocab, hidden, device=dev) / 8
    lora_a = torch.randn(slots, 8, hidden, device=dev) / 8
    lora_b = torch.randn(slots, hidden, 8, device=dev) / 8

    def step(x: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x @ w1.T)
        idx = slot.clamp(min=0)
        delta = torch.einsum("br,bhr->bh", torch.einsum("bh,brh->br", x, lora_a[idx]), lora_b[idx])
        h = h + delta * (slot >= 0).unsqueeze(1)
        return h @ w2.T

    timeline = Timeline()
    runner = CudaGraphRunner(
        step,
        [GraphInput("x", (hidden,), torch.float32), GraphInput("slot", (), torch.int64, -1)],
        default_capture_sizes(16),
        device=dev,
        timeline=timeline,
    )
    runner.capture()
    assert runner.captured and "graph_capture" in timeline.seconds
    for n in (1, 3, 8, 11, 16, 20):
        x = torch.randn(n, hidden, device=dev)
        slot = torch.randint(-1, slots, (n,), device=dev)
        torch.testing.assert_close(runner.run(x, slot).clone(), step(x, slot))
    x = torch.randn(5, hidden, device=dev)
    slot = torch.zeros(5, dtype=torch.int64, device=dev)
    eager = time_step(lambda: step(x, slot))
    replay = time_step(lambda: runner.run(x, slot))
    print(f"decode step: eager {eager * 1e6:.1f} us, graph replay {replay * 1e6:.1f} us")
