"""What a streaming load reads: per shard, the validated header and the tensors (or rows) wanted.

A plan is built from headers alone, so nothing is allocated yet. `select` keeps some tensors
(a name predicate or a set of names); `rows` asks for only some rows (leading-dimension indices)
of a tensor, e.g. one expert-parallel rank's experts of a fused 3-D expert tensor. A file read
only in part cannot have its sha256 checked; that is logged, not silently skipped.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from loraplex.loader.object_store import ObjectInfo
from loraplex.loader.range_plan import Piece, row_slice
from loraplex.loader.safetensors_header import SafetensorsHeader, TensorInfo

log = logging.getLogger(__name__)

Select = Callable[[str], bool] | Collection[str] | None
Rows = Callable[[str], Sequence[int] | None] | Mapping[str, Sequence[int]] | None


@dataclass(frozen=True)
class ShardPlan:
    """One file to read: its validated header, the tensors wanted, and the sha256 to check.

    `rows` maps a wanted tensor's name to the rows of it to read (all rows if absent).
    """

    key: str
    info: ObjectInfo
    header: SafetensorsHeader
    header_blob: bytes
    wanted: tuple[TensorInfo, ...]
    sha256: str | None
    rows: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def output(self, info: TensorInfo) -> tuple[tuple[int, ...], list[Piece]]:
        """The shape handed on for a wanted tensor and the file spans it is read from."""
        rows = self.rows.get(info.name)
        if rows is None:
            return info.shape, [Piece(0, info.begin, info.end)]
        return row_slice(info, rows)

    def output_bytes(self, info: TensorInfo) -> int:
        """Bytes of a wanted tensor that are fetched (its rows only, for a row slice)."""
        return sum(p.end - p.begin for p in self.output(info)[1])


@dataclass(frozen=True)
class LoadPlan:
    """Every shard of a checkpoint, validated; nothing allocated yet."""

    shards: tuple[ShardPlan, ...]

    @property
    def total_bytes(self) -> int:
        """Bytes of tensor data the plan fetches."""
        return sum(s.output_bytes(t) for s in self.shards for t in s.wanted)

    @property
    def names(self) -> list[str]:
        """Names of the tensors the plan yields, in fetch order."""
        return [t.name for s in self.shards for t in s.wanted]


def selector(select: Select, available: set[str]) -> Callable[[str], bool]:
    """A name predicate from `select`; a set naming absent tensors is a KeyError."""
    if select is None:
        return lambda name: True
    if callable(select):
        return select
    wanted = set(select)
    missing = sorted(wanted - available)
    if missing:
        raise KeyError(f"tensors not in the checkpoint: {missing[:5]}")
    return wanted.__contains__


def row_chooser(rows: Rows) -> Callable[[str], tuple[int, ...] | None]:
    """A name -> rows (or None: the whole tensor) function from `rows`."""
    if rows is None:
        return lambda name: None
    if callable(rows):
        fn = rows
    else:
        table = dict(rows)
        fn = table.get

    def choose(name: str) -> tuple[int, ...] | None:
        picked = fn(name)
        return None if picked is None else tuple(int(r) for r in picked)

    return choose


def choose_tensors(
    key: str,
    info: ObjectInfo,
    header: SafetensorsHeader,
    blob: bytes,
    keep: Callable[[str], bool],
    rows: Callable[[str], tuple[int, ...] | None],
    sha: str | None,
) -> ShardPlan:
    """The plan of one shard: kept tensors, their row slices, and the sha256 if read whole."""
    wanted = tuple(t for t in header.tensors.values() if keep(t.name))
    sliced: dict[str, tuple[int, ...]] = {}
    for t in wanted:
        picked = rows(t.name)
        if picked is not None and (not t.shape or picked != tuple(range(t.shape[0]))):
            row_slice(t, picked)  # validates the rows now, before anything is fetched
            sliced[t.name] = picked
    whole = len(wanted) == len(header.tensors) and not sliced
    if sha and not whole:
        log.info("%s: reading part of the file, its sha256 cannot be checked", key)
    return ShardPlan(key, info, header, blob, wanted, sha if whole else None, sliced)


def _in_and_kept(base: Collection[str], keep: Callable[[str], bool], name: str) -> bool:
    return name in base and keep(name)


def narrow_plan(plan: LoadPlan, select: Select = None, rows: Rows = None) -> LoadPlan:
    """A plan reading a subset of `plan`'s tensors (and rows), from the headers already read."""
    available = {n for s in plan.shards for n in s.header.tensors}
    keep = selector(select, available)
    choose = row_chooser(rows)
    shards = []
    for s in plan.shards:
        base = {t.name for t in s.wanted}
        shard = choose_tensors(
            s.key,
            s.info,
            s.header,
            s.header_blob,
            functools.partial(_in_and_kept, base, keep),
            choose,
            s.sha256,
        )
        shards.append(shard)
    return LoadPlan(tuple(shards))
