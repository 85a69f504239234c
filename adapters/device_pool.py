"""Device-resident adapter memory, budgeted in bytes, where an adapter costs its own rank.

The pool is a run of *rank rows* (S-LoRA style): row j of every targeted engine Linear holds
one rank row of A (for each fused slice) and one of B. An adapter of rank R takes R contiguous
rows in every buffer, so a rank-8 adapter costs 8 rows and a rank-64 one 64 rows, never a padded
`max_lora_rank` slot. Free extents are kept first-fit and coalesced; when the free space is
enough but fragmented, resident adapters are moved down (compaction). Eviction is LRU among
adapters no running request references (ref count 0).

Layout per Linear (the kernels read it): `a [rows, num_slices, in]`, `b [rows, out]` (B stored
transposed, slices side by side along `out` at the Linear's slice offsets). Rows past a module's
own rank, and the rows of slices an adapter does not target, are zero.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from loraplex.adapters.weights import LoadedAdapter


class AdapterPoolFullError(RuntimeError):
    """No room for an adapter even after evicting every unreferenced, unpinned one."""


@dataclass(frozen=True)
class LoraLinearSpec:
    """One engine Linear the pool backs: its layer, fused slice names and widths."""

    layer_idx: int
    slice_names: tuple[str, ...]
    in_features: int
    slice_sizes: tuple[int, ...]

    @property
    def out_features(self) -> int:
        """Total output width."""
        return sum(self.slice_sizes)

    @property
    def slice_offsets(self) -> tuple[int, ...]:
        """Start column of each slice in the fused output."""
        out, start = [], 0
        for size in self.slice_sizes:
            out.append(start)
            start += size
        return tuple(out)


@dataclass
class Resident:
    """An adapter in device memory: where its rows are, and its per-module ranks and scales."""

    key: str
    row_start: int
    rows: int
    ranks: list[list[int]]  # [linear][slice], 0 = not targeted
    scales: list[list[float]]  # [linear][slice]
    nbytes: int
    ranks_t: torch.Tensor  # [num_linears, max_slices] int32 (host)
    scales_t: torch.Tensor  # [num_linears, max_slices] float32 (host)
    refs: int = 0
    loaded_at: float = field(default_factory=time.monotonic)


@dataclass
class PoolStats:
    """Counters for /metrics."""

    loads: int = 0
    evictions: int = 0
    compactions: int = 0
    load_seconds: float = 0.0
    loads_by_key: Counter[str] = field(default_factory=Counter)
    evictions_by_key: Counter[str] = field(default_factory=Counter)


class DevicePool:
    """Adapter weights on the device in rank rows, with ref counts and LRU eviction."""

    def __init__(
        self,
        specs: list[LoraLinearSpec],
        capacity_bytes: int,
        max_lora_rank: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if not specs:
            raise ValueError("the pool needs at least one LoRA-targetable Linear")
        self.specs = list(specs)
        self.max_lora_rank = max_lora_rank
        self.dtype = dtype
        self.device = torch.device(device)
        self.row_bytes = self.bytes_per_row(specs, dtype)
        self.num_rows = capacity_bytes // self.row_bytes
        if self.num_rows < max(1, max_lora_rank):
            raise ValueError(
                f"adapter memory of {capacity_bytes} bytes holds {self.num_rows} rank rows "
                f"({self.row_bytes} bytes each); max_lora_rank={max_lora_rank} needs more"
            )
        self.a = [
            torch.zeros(
                self.num_rows, len(s.slice_names), s.in_features, dtype=dtype, device=device
            )
            for s in specs
        ]
        self.b = [
            torch.zeros(self.num_rows, s.out_features, dtype=dtype, device=device) for s in specs
        ]
        self.max_slices = max(len(s.slice_names) for s in specs)
        self._where: dict[tuple[int, str], tuple[int, int]] = {}
        for lid, s in enumerate(specs):
            for si, name in enumerate(s.slice_names):
                self._where[(s.layer_idx, name)] = (lid, si)
        self._entries: OrderedDict[str, Resident] = OrderedDict()  # LRU first
        self._free: list[tuple[int, int]] = [(0, self.num_rows)]  # (start, length), sorted
        self.stats = PoolStats()

    @staticmethod
    def bytes_per_row(specs: list[LoraLinearSpec], dtype: torch.dtype) -> int:
        """Device bytes one rank row takes across every backed Linear (A and B)."""
        elem = torch.empty((), dtype=dtype).element_size()
        return elem * sum(len(s.slice_names) * s.in_features + s.out_features for s in specs)

    # -- queries -----------------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        """Bytes of adapter memory the rows take."""
        return self.num_rows * self.row_bytes

    @property
    def used_rows(self) -> int:
        """Rows held by resident adapters."""
        return sum(r.rows for r in self._snapshot())

    @property
    def used_bytes(self) -> int:
        """Bytes held by resident adapters."""
        return self.used_rows * self.row_bytes

    def _snapshot(self) -> list[Resident]:
        """The residents as a list taken in one step: the replica's event loop reads totals
        (`/state`, `/metrics`) while the step thread reorders the LRU, and iterating the live
        dict there raises mid-way."""
        return list(self._entries.values())

    def get(self, key: str) -> Resident | None:
        """The resident entry for `key`, or None (does not touch LRU order)."""
        return self._entries.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def keys(self) -> list[str]:
        """Resident keys from least to most recently used."""
        return list(self._entries)

    def evictable_rows(self) -> int:
        """Rows that could be freed by evicting unreferenced adapters."""
        return sum(r.rows for r in self._snapshot() if r.refs == 0)

    def free_rows(self) -> int:
        """Rows not held by any adapter."""
        return sum(length for _, length in self._free)

    def can_hold(self, rows: int, key: str | None = None) -> bool:
        """Could an adapter of `rows` rank rows be made resident now (evicting if needed)?"""
        if key is not None and key in self._entries:
            return True
        return rows <= self.free_rows() + self.evictable_rows()

    # -- references ----------------------------------------------------------------------

    def acquire(self, key: str) -> Resident:
        """A running request now uses `key`: it cannot be evicted until released."""
        entry = self._entries[key]
        entry.refs += 1
        self._entries.move_to_end(key)
        return entry

    def release(self, key: str) -> None:
        """A request using `key` left the batch."""
        entry = self._entries.get(key)
        if entry is None or entry.refs == 0:
            raise RuntimeError(f"release of adapter {key[:12]} that holds no reference")
        entry.refs -= 1

    def references(self) -> int:
        """References held by running requests, all adapters together (0 when idle)."""
        return sum(r.refs for r in self._snapshot())

    def touch(self, key: str) -> None:
        """Mark `key` most recently used."""
        if key in self._entries:
            self._entries.move_to_end(key)

    # -- load and evict ----------------------------------------------------------------

    def load(self, adapter: LoadedAdapter) -> Resident:
        """Make `adapter` resident (no-op when it is), evicting LRU unused adapters to fit."""
        entry = self._entries.get(adapter.key)
        if entry is not None:
            self._entries.move_to_end(adapter.key)
            return entry
        t0 = time.perf_counter()
        rows = adapter.max_rank
        if rows > self.max_lora_rank:
            raise AdapterPoolFullError(
                f"adapter {adapter.key[:12]} has rank {rows} > max_lora_rank {self.max_lora_rank}"
            )
        for layer, module in adapter.modules:
            if (layer, module) not in self._where:
                raise ValueError(f"layer {layer} {module} has no LoRA rows in this engine")
        start = self._allocate(rows)
        ranks = [[0] * len(s.slice_names) for s in self.specs]
        scales = [[0.0] * len(s.slice_names) for s in self.specs]
        for lid in range(len(self.specs)):
            self.a[lid][start : start + rows].zero_()
            self.b[lid][start : start + rows].zero_()
        for (layer, module), m in adapter.modules.items():
            lid, si = self._where[(layer, module)]
            spec = self.specs[lid]
            off, size = spec.slice_offsets[si], spec.slice_sizes[si]
            r = m.rank
            self.a[lid][start : start + r, si].copy_(m.a, non_blocking=True)
            self.b[lid][start : start + r, off : off + size].copy_(m.b.t(), non_blocking=True)
            ranks[lid][si] = r
            scales[lid][si] = m.scale
        entry = Resident(
            key=adapter.key,
            row_start=start,
            rows=rows,
            ranks=ranks,
            scales=scales,
            nbytes=rows * self.row_bytes,
            ranks_t=self._table(ranks, torch.int32),
            scales_t=self._table(scales, torch.float32),
        )
        self._entries[adapter.key] = entry
        self.stats.loads += 1
        self.stats.loads_by_key[adapter.key] += 1
        self.stats.load_seconds += time.perf_counter() - t0
        return entry

    def _table(self, values: Sequence[Sequence[float]], dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros(len(self.specs), self.max_slices, dtype=dtype)
        for lid, row in enumerate(values):
            out[lid, : len(row)] = torch.tensor(row, dtype=dtype)
        return out

    def evict(self, key: str) -> None:
        """Drop `key` from the device; refuses while referenced."""
        entry = self._entries.get(key)
        if entry is None:
            return
        if entry.refs:
            raise RuntimeError(f"adapter {key[:12]} is in use and cannot be evicted")
        del self._entries[key]
        self._release_rows(entry.row_start, entry.rows)
        self.stats.evictions += 1
        self.stats.evictions_by_key[key] += 1

    def _allocate(self, rows: int) -> int:
        while True:
            for i, (start, length) in enumerate(self._free):
                if length >= rows:
                    if length == rows:
                        self._free.pop(i)
                    else:
                        self._free[i] = (start + rows, length - rows)
                    return start
            if self.free_rows() >= rows:
                self._compact()
                continue
            victim = next((k for k, r in self._entries.items() if r.refs == 0), None)
            if victim is None:
                raise AdapterPoolFullError(
                    f"no room for {rows} rank rows: {self.free_rows()} free of {self.num_rows}, "
                    "the rest held by running adapters"
                )
            self.evict(victim)

    def _release_rows(self, start: int, rows: int) -> None:
        self._free.append((start, rows))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for s, n in self._free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((s, n))
        self._free = merged

    def _compact(self) -> None:
        """Move every resident adapter down so the free rows form one extent at the end."""
        cursor = 0
        for entry in sorted(self._entries.values(), key=lambda e: e.row_start):
            if entry.row_start != cursor:
                src = slice(entry.row_start, entry.row_start + entry.rows)
                for lid in range(len(self.specs)):
                    self.a[lid][cursor : cursor + entry.rows] = self.a[lid][src].clone()
                    self.b[lid][cursor : cursor + entry.rows] = self.b[lid][src].clone()
                entry.row_start = cursor
            cursor += entry.rows
        self._free = [(cursor, self.num_rows - cursor)] if cursor < self.num_rows else []
        self.stats.compactions += 1
