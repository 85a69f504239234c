"""Plan the ranged GETs that fetch a set of tensors: contiguous runs cut into fixed-size ranges.

Only the wanted tensors are covered; adjacent wanted tensors share ranges, so a range may carry
the tail of one tensor and the head of the next. Each range lists its segments: which tensor a
slice of the range belongs to and where in that tensor it lands. A tensor may also be wanted in
part: a row slice (some indices of its leading dimension, e.g. one expert-parallel rank's experts
of a fused 3-D expert tensor) is only the byte spans of those rows, since the rows of a
contiguous row-major tensor are contiguous bytes.
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


@dataclass(frozen=True)
class Piece:
    """File bytes [begin, end) that land at `dest_offset` in output tensor `tensor`."""

    tensor: int
    begin: int
    end: int
    dest_offset: int = 0


def row_slice(info: TensorInfo, rows: Sequence[int]) -> tuple[tuple[int, ...], list[Piece]]:
    """The shape of `info`'s rows `rows` (leading-dim indices, output in the order given) and
    the file byte spans they come from (consecutive rows merged into one span).

    Pieces are numbered with tensor id 0; callers re-number them (`dataclasses.replace`).
    """
    if not info.shape:
        raise ValueError(f"{info.name}: a scalar has no rows to slice")
    n = info.shape[0]
    picked = list(rows)
    if len(set(picked)) != len(picked):
        raise ValueError(f"{info.name}: row slice names a row twice: {picked}")
    bad = [r for r in picked if not 0 <= r < n]
    if bad:
        raise ValueError(f"{info.name}: rows {bad} out of range for leading dimension {n}")
    row_bytes = info.nbytes // n if n else 0
    pieces: list[Piece] = []
    for out_row, row in enumerate(picked):
        begin = info.begin + row * row_bytes
        dest = out_row * row_bytes
        last = pieces[-1] if pieces else None
        if (
            last is not None
            and last.end == begin
            and last.dest_offset + (last.end - last.begin) == dest
        ):
            pieces[-1] = Piece(0, last.begin, begin + row_bytes, last.dest_offset)
        else:
            pieces.append(Piece(0, begin, begin + row_bytes, dest))
    return (len(picked), *info.shape[1:]), pieces


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
    pieces = [Piece(i, t.begin, t.end) for i, t in zip(ids, tensors, strict=True)]
    return plan_pieces(pieces, chunk_bytes, file_index)


def plan_pieces(pieces: Sequence[Piece], chunk_bytes: int, file_index: int = 0) -> list[ByteRange]:
    """Cut the file spans of `pieces` (whole tensors or row slices) into ranges of at most
    `chunk_bytes`; back-to-back spans share ranges, gaps are never fetched. File order."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    ordered = sorted((p for p in pieces if p.end > p.begin), key=lambda p: p.begin)
    for prev, cur in zip(ordered, ordered[1:], strict=False):
        if cur.begin < prev.end:
            raise ValueError("pieces must not overlap")
    runs: list[tuple[int, int, list[Piece]]] = []
    for p in ordered:
        if runs and runs[-1][1] == p.begin:
            runs[-1][2].append(p)
            runs[-1] = (runs[-1][0], p.end, runs[-1][2])
        else:
            runs.append((p.begin, p.end, [p]))
    ranges: list[ByteRange] = []
    for run_start, run_end, members in runs:
        k = 0  # index into members of the first piece the current range may touch
        for start in range(run_start, run_end, chunk_bytes):
            end = min(start + chunk_bytes, run_end)
            segments: list[Segment] = []
            j = k
            while j < len(members):
                p = members[j]
                if p.begin >= end:
                    break
                lo, hi = max(p.begin, start), min(p.end, end)
                segments.append(
                    Segment(p.tensor, p.dest_offset + lo - p.begin, lo - start, hi - lo)
                )
                if p.end <= end:
                    k = j + 1
                j += 1
            ranges.append(ByteRange(file_index, start, end, tuple(segments)))
    return ranges
