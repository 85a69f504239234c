"""Plan the ranged GETs that fetch a set of tensors: contiguous runs cut into fixed-size ranges.

Only the wanted tensors are covered; adjacent wanted tensors share ranges, so a range may carry
the tail of one tensor and the head of the next. Each range lists its segments: which tensor a
slice of the range belongs to and where in that tensor it lands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loraplex.loader.safetensors_header import TensorInfo

MIB = 1024 * 1024


@dataclass(frozen=True)
class Segment:
    """A slice of a range: `length` bytes at `range_offset` belong to tensor `tensor` at `tensor_offset`."""

    tensor: int
    tensor_offset: int
    range_offset: int
    length: int


@dataclass(frozen=True)
class ByteRange:
    """One ranged GET: bytes [start, end) of file `file_index`, split into tensor segments."""

    file_index: int
    start: int
    end: int
    segments: tuple[Segment, ...]

    @property
    def nbytes(self) -> int:
        """Bytes this range fetches."""
        return self.end - self.start


def contiguous_runs(tensors: Sequence[TensorInfo]) -> list[tuple[int, int, list[int]]]:
    """Group tensors (sorted by offset) into runs of back-to-back bytes: (start, end, indices)."""
    runs: list[tuple[int, int, list[int]]] = []
    for i, info in enumerate(tensors):
        if info.nbytes == 0:
            continue
        if runs and runs[-1][1] == info.begin:
            start, _, members = runs[-1]
            members.append(i)
            runs[-1] = (start, info.end, members)
        else:
            runs.append((info.begin, info.end, [i]))
    return runs


def plan_ranges(
    tensors: Sequence[TensorInfo],
    chunk_bytes: int,
    file_index: int = 0,
    tensor_ids: Sequence[int] | None = None,
) -> list[ByteRange]:
    """Cut the bytes of `tensors` (sorted by offset) into ranges of at most `chunk_bytes`.

    `tensor_ids` names each tensor in the segments (default: its index in `tensors`).
    Ranges come out in file order.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    ids = list(range(len(tensors))) if tensor_ids is None else list(tensor_ids)
    if len(ids) != len(tensors):
        raise ValueError("tensor_ids must name every tensor")
    for prev, cur in zip(tensors, tensors[1:], strict=False):
        if cur.begin < prev.end:
            raise ValueError("tensors must be sorted by offset and must not overlap")
    ranges: list[ByteRange] = []
    for run_start, run_end, members in contiguous_runs(tensors):
        k = 0  # index into members of the first tensor the current range may touch
        for start in range(run_start, run_end, chunk_bytes):
            end = min(start + chunk_bytes, run_end)
            segments: list[Segment] = []
            j = k
            while j < len(members):
                info = tensors[members[j]]
                if info.begin >= end:
                    break
                lo = max(info.begin, start)
                hi = min(info.end, end)
                segments.append(Segment(ids[members[j]], lo - info.begin, lo - start, hi - lo))
                if info.end <= end:
                    k = j + 1
                j += 1
            ranges.append(ByteRange(file_index, start, end, tuple(segments)))
    return ranges
