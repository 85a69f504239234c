"""Where fetched range bytes land: straight into CPU tensors, or via pinned slots into GPU memory.

A sink allocates each tensor's destination (a flat uint8 buffer on the target device), reads a
range's bytes into memory on a worker thread, and tells the streaming loop when a range's
memory may be reused. The CPU sink reads from the socket directly into the final tensors, so a
CPU load makes no staging copy at all. The staged sink (used for GPUs) reads into a bounded
pool of pinned host slots and copies each slot's segments to the device on a side stream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from loraplex.loader.object_store import ObjectReader
from loraplex.loader.range_plan import ByteRange

if TYPE_CHECKING:
    from loraplex.loader.stream_reader import StreamConfig
    from loraplex.loader.timeline import Timeline


class _HasDest(Protocol):
    dest: torch.Tensor | None


def _byte_view(t: torch.Tensor) -> memoryview:
    """A writable memoryview over a CPU uint8 tensor's memory (no copy)."""
    return t.numpy().data.cast("B")


class Sink(Protocol):
    """What the streaming loop needs from a destination device."""

    device: torch.device

    def allocate(self, nbytes: int) -> torch.Tensor:
        """A flat uint8 destination buffer for one tensor."""
        ...

    def has_room(self) -> bool:
        """Whether another range may be started now."""
        ...

    def reserve(self, ri: int) -> None:
        """Claim the memory range `ri` will be read into (main thread)."""
        ...

    def fetch(
        self, store: ObjectReader, key: str, ri: int, r: ByteRange, tasks: Sequence[_HasDest]
    ) -> None:
        """Read range `r` of `key` and put its bytes into the tensors' destinations (worker thread)."""
        ...

    def host_views(self, ri: int, r: ByteRange, tasks: Sequence[_HasDest]) -> list[memoryview]:
        """The range's bytes in host memory, in order (valid until `release`)."""
        ...

    def release(self, ri: int) -> None:
        """The range's host memory may be reused."""
        ...


class CpuSink:
    """Reads ranges from the socket directly into the final CPU tensors."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")

    def allocate(self, nbytes: int) -> torch.Tensor:
        """Uninitialised CPU bytes; every byte is written by a fetch before the tensor is used."""
        return torch.empty(nbytes, dtype=torch.uint8)

    def has_room(self) -> bool:
        """Always: the destinations are the output itself."""
        return True

    def reserve(self, ri: int) -> None:
        """Nothing to claim."""

    def host_views(self, ri: int, r: ByteRange, tasks: Sequence[_HasDest]) -> list[memoryview]:
        """Slices of the destination tensors this range fills."""
        views = []
        for seg in r.segments:
            dest = tasks[seg.tensor].dest
            assert dest is not None
            views.append(_byte_view(dest)[seg.tensor_offset : seg.tensor_offset + seg.length])
        return views

    def fetch(
        self, store: ObjectReader, key: str, ri: int, r: ByteRange, tasks: Sequence[_HasDest]
    ) -> None:
        """One ranged GET scattered into the destination tensors."""
        store.get_range_into(key, r.start, self.host_views(ri, r, tasks))

    def release(self, ri: int) -> None:
        """Nothing to free."""


class StagedSink:
    """Reads ranges into a bounded pool of host slots (pinned on a GPU), then copies them on.

    On CUDA the copies run asynchronously on a per-thread side stream, which the worker then
    waits for before the slot is reused. On CPU the same path runs with plain copies (used to
    exercise the bookkeeping without a GPU, or to bound host memory on purpose).
    """

    def __init__(self, device: torch.device, config: StreamConfig, timeline: Timeline) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise RuntimeError("a CUDA target needs a CUDA device; none is available")
        if not self.cuda and device.type != "cpu":
            raise ValueError(f"unsupported target device {device}; use cpu or cuda")
        if self.cuda and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.chunk = config.chunk_bytes
        self.max_slots = max(1, config.window() // config.chunk_bytes)
        self.slots: list[torch.Tensor] = []
        self.free: list[int] = []
        self.slot_of: dict[int, int] = {}
        self.timeline = timeline
        self._local = threading.local()

    def allocate(self, nbytes: int) -> torch.Tensor:
        """Uninitialised bytes on the target device."""
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def has_room(self) -> bool:
        """A slot is free or may still be allocated."""
        return bool(self.free) or len(self.slots) < self.max_slots

    def reserve(self, ri: int) -> None:
        """Take a free slot for range `ri` (allocating one, up to the bound)."""
        if not self.free:
            slot = torch.empty(self.chunk, dtype=torch.uint8, pin_memory=self.cuda)
            self.slots.append(slot)
            self.free.append(len(self.slots) - 1)
        self.slot_of[ri] = self.free.pop()

    def _stream(self) -> torch.cuda.Stream:
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = torch.cuda.Stream(device=self.device)
            self._local.stream = stream
        return stream

    def host_views(self, ri: int, r: ByteRange, tasks: Sequence[_HasDest]) -> list[memoryview]:
        """The slot holding the range."""
        return [_byte_view(self.slots[self.slot_of[ri]])[: r.nbytes]]

    def _copy_segments(self, slot: torch.Tensor, r: ByteRange, tasks: Sequence[_HasDest]) -> None:
        for seg in r.segments:
            dest = tasks[seg.tensor].dest
            assert dest is not None
            src = slot[seg.range_offset : seg.range_offset + seg.length]
            dest[seg.tensor_offset : seg.tensor_offset + seg.length].copy_(src, non_blocking=True)

    def fetch(
        self, store: ObjectReader, key: str, ri: int, r: ByteRange, tasks: Sequence[_HasDest]
    ) -> None:
        """Ranged GET into the slot, then copy each segment on (async on a GPU) and wait."""
        slot = self.slots[self.slot_of[ri]]
        store.get_range_into(key, r.start, [_byte_view(slot)[: r.nbytes]])
        t0 = time.perf_counter()
        if self.cuda:
            stream = self._stream()
            # Destinations were allocated on the default stream: order after it.
            stream.wait_stream(torch.cuda.default_stream(self.device))
            with torch.cuda.stream(stream):
                self._copy_segments(slot, r, tasks)
            stream.synchronize()
        else:
            self._copy_segments(slot, r, tasks)
        self.timeline.add("device_copy", time.perf_counter() - t0)

    def release(self, ri: int) -> None:
        """Give the range's slot back to the pool."""
        self.free.append(self.slot_of.pop(ri))
