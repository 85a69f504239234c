"""Stream safetensors checkpoints from object storage into device memory, tensor by tensor.

The headers are read and validated first (one ranged GET each, a second only for a header
larger than the probe), so a bad file fails before any weight is allocated. The wanted tensors'
bytes are cut into 8-16 MiB ranges and fetched by many concurrent ranged GETs. On CPU each range
is read straight from the socket into the final tensors' memory (no staging copy); on a GPU it
lands in a pinned staging slot and is copied to the device on a side stream. A bounded window of
bytes is in flight at once, and each tensor is handed on as soon as all its bytes are in, while
later ranges are still being fetched. Where the whole file is read and a sha256 is recorded, the
bytes are hashed in file order and a mismatch raises.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from loraplex.loader.checkpoint_index import CheckpointFiles, check_against_index
from loraplex.loader.checkpoint_index import resolve_checkpoint as _resolve
from loraplex.loader.device_sink import CpuSink, Sink, StagedSink
from loraplex.loader.load_plan import (
    LoadPlan,
    Rows,
    Select,
    ShardPlan,
    choose_tensors,
    narrow_plan,
    row_chooser,
    selector,
)
from loraplex.loader.node_cache import CachedStore, NodeCache
from loraplex.loader.object_store import ObjectInfo, ObjectStore
from loraplex.loader.quant.quantizer import TensorQuantizer
from loraplex.loader.range_plan import ByteRange, plan_pieces
from loraplex.loader.safetensors_header import (
    MAX_HEADER_BYTES,
    TORCH_DTYPE_NAMES,
    SafetensorsError,
    SafetensorsHeader,
    TensorInfo,
    parse_header,
    read_header_length,
)
from loraplex.loader.storage import DEFAULT_CHUNK_BYTES, DEFAULT_CONCURRENCY, StorageConfig
from loraplex.loader.timeline import BYTES_FETCHED, RANGE_RETRIES, Timeline, byte_progress

log = logging.getLogger(__name__)


def torch_dtype(dtype_str: str) -> torch.dtype:
    """Map a safetensors dtype string (e.g. "BF16") to its torch dtype."""
    name = TORCH_DTYPE_NAMES.get(dtype_str)
    if name is None:
        raise SafetensorsError(f"unknown dtype {dtype_str!r}")
    dtype: torch.dtype | None = getattr(torch, name, None)
    if dtype is None:
        raise SafetensorsError(f"dtype {dtype_str} is not supported by this torch build")
    return dtype


__all__ = ["LoadPlan", "ShardPlan", "StreamConfig", "StreamLoader", "FetchStats", "narrow_plan"]


class ChecksumMismatchError(RuntimeError):
    """The bytes read do not hash to the sha256 recorded for the file."""


@dataclass(frozen=True)
class StreamConfig:
    """Knobs of the streaming loader."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    concurrency: int = DEFAULT_CONCURRENCY
    window_bytes: int | None = None
    """Bytes fetched but not yet handed on, at most (default: 2 x concurrency x chunk)."""
    header_probe_bytes: int = 256 * 1024
    max_header_bytes: int = MAX_HEADER_BYTES
    verify_sha256: bool = True
    progress: bool = False

    def __post_init__(self) -> None:
        if self.chunk_bytes < 1 or self.concurrency < 1 or self.header_probe_bytes < 8:
            raise ValueError(
                "chunk_bytes and concurrency must be >= 1 and header_probe_bytes >= 8, got "
                f"{self.chunk_bytes}, {self.concurrency}, {self.header_probe_bytes}"
            )
        if self.window_bytes is not None and self.window_bytes < 1:
            raise ValueError(f"window_bytes must be >= 1, got {self.window_bytes}")

    @classmethod
    def from_storage(cls, storage: StorageConfig, **overrides: Any) -> StreamConfig:
        """The loader knobs a storage configuration asks for (plus any explicit overrides)."""
        values: dict[str, Any] = {
            "chunk_bytes": storage.chunk_bytes,
            "concurrency": storage.concurrency,
            "max_header_bytes": MAX_HEADER_BYTES,
        }
        values.update(overrides)
        return cls(**values)

    def window(self) -> int:
        """The in-flight byte window actually used."""
        return self.window_bytes or 2 * self.concurrency * self.chunk_bytes


@dataclass
class FetchStats:
    """What a loader has fetched and handed on so far (all its loads together)."""

    ranges: int = 0
    range_bytes: int = 0
    tensors: int = 0
    tensor_bytes: int = 0


@dataclass
class _Task:
    shard: int
    info: TensorInfo
    remaining: int
    shape: tuple[int, ...]
    nbytes: int
    dest: torch.Tensor | None = None


class _Digest(Protocol):
    """What a shard's hasher needs of a `hashlib` hash."""

    def update(self, data: memoryview, /) -> None: ...
    def hexdigest(self) -> str: ...


@dataclass
class _Hasher:
    sha: _Digest
    expected: str
    key: str
    next_offset: int
    end: int
    waiting: dict[int, int] = field(default_factory=dict)


class StreamLoader:
    """Streams tensors of safetensors files in object storage to a device."""

    def __init__(
        self,
        store: ObjectStore | CachedStore,
        config: StreamConfig | None = None,
        timeline: Timeline | None = None,
    ) -> None:
        self.store = store
        self.config = config or StreamConfig()
        self.timeline = timeline or Timeline()
        self.stats = FetchStats()

    def read_header(self, key: str) -> tuple[SafetensorsHeader, ObjectInfo, bytes]:
        """Fetch and validate a file's header: (header, object info, the first 8+N bytes)."""
        cfg = self.config
        prefix, info = self.store.read_prefix(key, max(8, cfg.header_probe_bytes))
        try:
            n = read_header_length(prefix[:8], info.size, cfg.max_header_bytes)
        except SafetensorsError as exc:
            raise SafetensorsError(f"{key}: {exc}") from None
        if len(prefix) < 8 + n:
            prefix = prefix + self.store.get_range(key, len(prefix), 8 + n)
        blob = bytes(prefix[: 8 + n])
        try:
            header = parse_header(blob[8:], info.size)
        except SafetensorsError as exc:
            raise SafetensorsError(f"{key}: {exc}") from None
        return header, info, blob

    def resolve(self, location: str) -> CheckpointFiles:
        """The files a location stands for: one `.safetensors`, an index, or a folder prefix."""
        return _resolve(self.store, location)

    def plan(
        self,
        location: str | CheckpointFiles,
        select: Select = None,
        expected_sha256: Mapping[str, str] | None = None,
        rows: Rows = None,
    ) -> LoadPlan:
        """Read and validate every header (concurrently); pick the wanted tensors (and rows)."""
        files = location if isinstance(location, CheckpointFiles) else self.resolve(location)
        with self.timeline.phase("header"):
            workers = max(1, min(self.config.concurrency, len(files.keys)))
            with ThreadPoolExecutor(workers) as pool:
                headers = list(pool.map(self.read_header, files.keys))
        check_against_index(
            files, [(k, list(h.tensors)) for k, (h, _, _) in zip(files.keys, headers, strict=True)]
        )
        available = {n for h, _, _ in headers for n in h.tensors}
        keep = selector(select, available)
        choose = row_chooser(rows)
        shards = []
        for key, (header, info, blob) in zip(files.keys, headers, strict=True):
            sha = (expected_sha256 or {}).get(key) or info.sha256
            verify = sha.lower() if (sha and self.config.verify_sha256) else None
            shards.append(choose_tensors(key, info, header, blob, keep, choose, verify))
        return LoadPlan(tuple(shards))

    def load(
        self,
        location: str | CheckpointFiles | LoadPlan,
        *,
        device: str | torch.device = "cpu",
        select: Select = None,
        quantizer: TensorQuantizer | None = None,
        expected_sha256: Mapping[str, str] | None = None,
        staging: bool | None = None,
        rows: Rows = None,
    ) -> dict[str, torch.Tensor]:
        """All wanted tensors as a dict (see `iter_tensors`)."""
        return dict(
            self.iter_tensors(
                location,
                device=device,
                select=select,
                quantizer=quantizer,
                expected_sha256=expected_sha256,
                staging=staging,
                rows=rows,
            )
        )

    def iter_tensors(
        self,
        location: str | CheckpointFiles | LoadPlan,
        *,
        device: str | torch.device = "cpu",
        select: Select = None,
        quantizer: TensorQuantizer | None = None,
        expected_sha256: Mapping[str, str] | None = None,
        staging: bool | None = None,
        rows: Rows = None,
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, tensor) on `device` as each tensor's bytes are all in.

        `select` keeps only some tensors (a predicate or a set of names: e.g. one
        expert-parallel rank's experts); `rows` reads only some rows of a tensor (name -> rows
        of its leading dimension, e.g. a rank's experts of a fused expert tensor), which is then
        handed on with just those rows, in the order asked; both apply to a location, not to an
        already-built plan (see `narrow_plan`). `quantizer` is applied to each tensor on the device.
        `staging` forces the bounded host staging pool on or off; by default it is used for
        GPUs only (CPU loads read straight into the final tensors).
        """
        plan = (
            location
            if isinstance(location, LoadPlan)
            else self.plan(location, select, expected_sha256, rows)
        )
        dev = torch.device(device)
        staged = dev.type != "cpu" if staging is None else staging
        if dev.type != "cpu" and not staged:
            raise ValueError("a non-CPU target needs the staging pool")
        sink: Sink = StagedSink(dev, self.config, self.timeline) if staged else CpuSink()
        yield from _Run(self, plan, sink, quantizer).run()


class _Run:
    """One pass of the streaming loop over a plan (main thread: planning, bookkeeping, yields)."""

    def __init__(
        self, loader: StreamLoader, plan: LoadPlan, sink: Sink, quantizer: TensorQuantizer | None
    ) -> None:
        self.loader, self.plan, self.sink, self.quantizer = loader, plan, sink, quantizer
        self.cfg = loader.config
        self.tasks: list[_Task] = []
        self.ranges: list[ByteRange] = []
        self.hashers: dict[int, _Hasher] = {}
        for si, shard in enumerate(plan.shards):
            ids = list(range(len(self.tasks), len(self.tasks) + len(shard.wanted)))
            pieces, shapes, sizes = [], [], []
            for i, t in zip(ids, shard.wanted, strict=True):
                shape, spans = shard.output(t)
                pieces += [dataclasses.replace(p, tensor=i) for p in spans]
                shapes.append(shape)
                sizes.append(sum(p.end - p.begin for p in spans))
            shard_ranges = plan_pieces(pieces, self.cfg.chunk_bytes, si)
            counts = dict.fromkeys(ids, 0)
            for r in shard_ranges:
                for seg in r.segments:
                    counts[seg.tensor] += 1
            self.tasks += [
                _Task(si, t, counts[i], shape, n)
                for i, t, shape, n in zip(ids, shard.wanted, shapes, sizes, strict=True)
            ]
            self.ranges += shard_ranges
            if shard.sha256:
                sha = hashlib.sha256(shard.header_blob)
                end = shard.header.file_size
                self.hashers[si] = _Hasher(
                    sha, shard.sha256, shard.key, shard.header.data_start, end
                )
        self.ready: list[int] = [i for i, t in enumerate(self.tasks) if t.remaining == 0]

    def _finish(self, i: int) -> Iterator[tuple[str, torch.Tensor]]:
        task = self.tasks[i]
        info = task.info
        dtype = torch_dtype(info.dtype)
        if task.dest is None:  # a tensor with no bytes
            tensor = torch.empty(task.shape, dtype=dtype, device=self.sink.device)
        else:
            tensor = task.dest.view(dtype).reshape(task.shape)
            task.dest = None
        stats = self.loader.stats
        stats.tensors += 1
        stats.tensor_bytes += task.nbytes
        if self.quantizer is None:
            yield info.name, tensor
            return
        with self.loader.timeline.phase("quantize"):
            out = self.quantizer.apply(info.name, tensor)
        yield from out

    def _release(self, ri: int) -> None:
        r = self.ranges[ri]
        self.sink.release(ri)
        self.inflight -= r.nbytes
        for seg in r.segments:
            task = self.tasks[seg.tensor]
            task.remaining -= 1
            if task.remaining == 0:
                self.ready.append(seg.tensor)

    def _fetched(self, ri: int) -> None:
        r = self.ranges[ri]
        hasher = self.hashers.get(r.file_index)
        if hasher is None:
            self._release(ri)
            return
        hasher.waiting[r.start] = ri
        while hasher.next_offset in hasher.waiting:
            rj = hasher.waiting.pop(hasher.next_offset)
            for view in self.sink.host_views(rj, self.ranges[rj], self.tasks):
                hasher.sha.update(view)
            hasher.next_offset = self.ranges[rj].end
            self._release(rj)
        self._check_hash(r.file_index)

    def _check_hash(self, shard: int) -> None:
        """Once a shard's bytes are all hashed, compare with the recorded sha256."""
        hasher = self.hashers[shard]
        if hasher.next_offset != hasher.end:
            return
        got = hasher.sha.hexdigest()
        del self.hashers[shard]
        if got != hasher.expected:
            # A node-local copy that went bad is dropped, so the next load streams S3 again.
            dropped = isinstance(self.loader.store, CachedStore) and self.loader.store.forget(
                hasher.key
            )
            raise ChecksumMismatchError(
                f"{hasher.key}: sha256 is {got}, expected {hasher.expected}"
                + ("; the node cache's copy was dropped" if dropped else "")
            )

    def _submit(self, pool: ThreadPoolExecutor, ri: int) -> Future[None]:
        r = self.ranges[ri]
        for seg in r.segments:
            task = self.tasks[seg.tensor]
            if task.dest is None:
                task.dest = self.sink.allocate(task.nbytes)
        self.sink.reserve(ri)
        self.inflight += r.nbytes
        key = self.plan.shards[r.file_index].key
        return pool.submit(self.sink.fetch, self.loader.store, key, ri, r, self.tasks)

    def run(self) -> Iterator[tuple[str, torch.Tensor]]:
        cfg, store, timeline = self.cfg, self.loader.store, self.loader.timeline
        retries_before = store.retries
        for shard in list(self.hashers):  # files with no data bytes at all
            self._check_hash(shard)
        for i in self.ready:
            yield from self._finish(i)
        self.ready = []
        self.inflight = 0
        window = cfg.window()
        pending: dict[Future[None], int] = {}
        nxt = 0
        t0 = time.perf_counter()
        pool = ThreadPoolExecutor(max(1, cfg.concurrency), thread_name_prefix="loraplex-fetch")
        try:
            with byte_progress(cfg.progress) as progress:
                bar = progress.add_task("weights", total=self.plan.total_bytes)
                while nxt < len(self.ranges) or pending:
                    while nxt < len(self.ranges) and (
                        not pending
                        or (
                            self.inflight + self.ranges[nxt].nbytes <= window
                            and len(pending) < 2 * cfg.concurrency
                            and self.sink.has_room()
                        )
                    ):
                        pending[self._submit(pool, nxt)] = nxt
                        nxt += 1
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in done:
                        ri = pending.pop(fut)
                        fut.result()
                        BYTES_FETCHED.inc(self.ranges[ri].nbytes)
                        self.loader.stats.ranges += 1
                        self.loader.stats.range_bytes += self.ranges[ri].nbytes
                        progress.update(bar, advance=self.ranges[ri].nbytes)
                        self._fetched(ri)
                    ready, self.ready = self.ready, []
                    for i in ready:
                        yield from self._finish(i)
        finally:
            for fut in pending:
                fut.cancel()
            pool.shutdown(wait=True)
            timeline.add("fetch", time.perf_counter() - t0)
            RANGE_RETRIES.inc(store.retries - retries_before)


def open_loader(
    storage: StorageConfig, *, progress: bool = False, timeline: Timeline | None = None
) -> StreamLoader:
    """A streaming loader for the object store and knobs of `storage` (through the node-local
    cache when `storage.local_cache_dir` names one)."""
    store = ObjectStore(storage, max_pool_connections=max(16, 2 * storage.concurrency))
    source: ObjectStore | CachedStore = store
    if storage.local_cache_dir:
        cache = NodeCache(storage.local_cache_dir, storage.local_cache_max_bytes)
        source = CachedStore(store, cache)
    return StreamLoader(source, StreamConfig.from_storage(storage, progress=progress), timeline)
