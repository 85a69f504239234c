"""Pre-captured CUDA graphs for the decode step: capture once per batch size, then replay.

After the weights are in, the decode step is captured for a list of batch sizes, largest
first, all graphs sharing one memory pool; each capture is preceded by a warm-up on a side
stream. Inputs live in static buffers sized for the largest batch; a live batch is copied in,
padded up to the next captured size, and the graph replayed. Without CUDA nothing here is
faked: `CudaGraphRunner.available()` is False and capturing raises.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from loraplex.loader.timeline import Timeline


def default_capture_sizes(max_batch: int) -> list[int]:
    """vLLM-style sizes up to `max_batch`: 1, 2, 4, then steps of 8 (largest first)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = {s for s in (1, 2, 4) if s <= max_batch}
    sizes.update(range(8, max_batch + 1, 8))
    sizes.add(max_batch)
    return sorted(sizes, reverse=True)


def pad_to_captured(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size >= n, or None if n exceeds them all (run eager then)."""
    ordered = sorted(sizes)
    i = bisect.bisect_left(ordered, n)
    return ordered[i] if i < len(ordered) else None


@dataclass(frozen=True)
class GraphInput:
    """One input of the step: per-row shape after the batch dim, dtype, and the value for padding rows."""

    name: str
    row_shape: tuple[int, ...]
    dtype: torch.dtype
    pad_value: float | int = 0


class CudaGraphRunner:
    """Captures `step(*inputs) -> Tensor` (batch dim first everywhere) per batch size and replays it.

    The tensor `run` returns is a view of the graph's static output: read it (or copy it)
    before the next `run`.
    """

    def __init__(
        self,
        step: Callable[..., torch.Tensor],
        inputs: Sequence[GraphInput],
        batch_sizes: Sequence[int],
        *,
        device: torch.device | str = "cuda",
        warmup_iters: int = 2,
        timeline: Timeline | None = None,
    ) -> None:
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError("batch_sizes must be a non-empty list of positive sizes")
        self.step = step
        self.inputs = list(inputs)
        self.sizes = sorted(set(batch_sizes), reverse=True)
        self.device = torch.device(device)
        self.warmup_iters = warmup_iters
        self.timeline = timeline
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.static: list[torch.Tensor] = []

    @staticmethod
    def available() -> bool:
        """Whether CUDA graphs can be used here at all."""
        return torch.cuda.is_available()

    @property
    def captured(self) -> bool:
        """True once every batch size has a graph."""
        return len(self.graphs) == len(self.sizes)

    def capture(self) -> float:
        """Warm up and capture every batch size (largest first, one pool); return seconds taken."""
        if not self.available():
            raise RuntimeError("CUDA graphs need a CUDA device; on CPU the step runs eager")
        t0 = time.perf_counter()
        max_bs = self.sizes[0]
        self.static = [
            torch.full(
                (max_bs, *spec.row_shape), spec.pad_value, dtype=spec.dtype, device=self.device
            )
            for spec in self.inputs
        ]
        pool = None
        warm_s = 0.0
        for bs in self.sizes:
            args = [buf[:bs] for buf in self.static]
            w0 = time.perf_counter()
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(self.warmup_iters):
                    self.step(*args)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            warm_s += time.perf_counter() - w0
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self.step(*args)
            if pool is None:
                pool = graph.pool()
            self.graphs[bs] = (graph, out)
        torch.cuda.synchronize(self.device)
        total = time.perf_counter() - t0
        if self.timeline is not None:
            self.timeline.add("warmup", warm_s)
            self.timeline.add("graph_capture", total - warm_s)
        return total

    def run(self, *tensors: torch.Tensor) -> torch.Tensor:
        """Run one step on a live batch: replay the graph of the next captured size, else eager."""
        if len(tensors) != len(self.inputs):
            raise ValueError(f"expected {len(self.inputs)} inputs, got {len(tensors)}")
        n = tensors[0].shape[0]
        bs = pad_to_captured(n, self.sizes) if self.graphs else None
        if bs is None:
            return self.step(*tensors)
        for spec, buf, t in zip(self.inputs, self.static, tensors, strict=True):
            if t.shape[0] != n or tuple(t.shape[1:]) != spec.row_shape:
                raise ValueError(f"input {spec.name!r} has shape {tuple(t.shape)}")
            buf[:n].copy_(t, non_blocking=True)
            if bs > n:
                buf[n:bs].fill_(spec.pad_value)
        graph, out = self.graphs[bs]
        graph.replay()
        return out[:n]


def time_step(fn: Callable[[], object], iters: int = 50) -> float:
    """Mean seconds per call of `fn` on the GPU (synchronised), after a few warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters
