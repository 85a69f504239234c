"""A node-local copy of weight files, so a replica's second cold start on a node reads the
node's disk (a hostPath on NVMe, or a shared file system) instead of re-streaming S3.

`CachedStore` stands in for an `ObjectStore` in the loader. A file is kept only once every
byte of it has been read through the cache (a rank that reads some tensors leaves nothing),
and a kept copy is served only while S3 still reports the ETag and size recorded beside it
(one HEAD per file per load). Each filler writes its own partial file and renames it into
place, so replicas loading one model on one node never read a half-written copy. A cache that
cannot write (disk full, read-only) is skipped with a warning: the load goes on from S3.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.loader.object_store import ObjectInfo, ObjectStore

log = logging.getLogger(__name__)

STALE_PARTIAL_S = 24 * 3600
"""A partial file this old belongs to a filler that died; eviction removes it."""


@dataclass(frozen=True)
class CacheEntry:
    """One kept file: its S3 key, where it lies, its size and ETag, and when it was last used."""

    key: str
    path: Path
    size: int
    etag: str
    used_ns: int


class NodeCache:
    """The cache directory: finds a current copy, starts fills, keeps under its byte limit."""

    def __init__(self, root: str | Path, max_bytes: int | None = None) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    def _stem(self, bucket: str, key: str) -> Path:
        digest = hashlib.sha256(f"{bucket}\0{key}".encode()).hexdigest()
        return self.root / "objects" / digest[:2] / digest

    def lookup(self, bucket: str, info: ObjectInfo) -> Path | None:
        """The kept copy of `info`'s version of the object, or None (a stale one is removed)."""
        stem = self._stem(bucket, info.key)
        meta = _read_meta(stem.with_suffix(".json"))
        if meta is None:
            return None
        data = stem.with_suffix(".data")
        current = meta.get("etag") == info.etag and meta.get("size") == info.size
        if current and _size(data) == info.size:
            now = time.time_ns()
            with contextlib.suppress(OSError):
                os.utime(stem.with_suffix(".json"), ns=(now, now))
            return data
        _remove(stem.with_suffix(".json"), data)
        return None

    def remove(self, bucket: str, key: str) -> None:
        """Drop the kept copy of `key` (readers that have it open keep their bytes)."""
        stem = self._stem(bucket, key)
        _remove(stem.with_suffix(".json"), stem.with_suffix(".data"))

    def start_fill(self, bucket: str, info: ObjectInfo) -> Fill | None:
        """A fill for the object's current version, or None when it cannot or should not be kept."""
        if info.etag is None or (self.max_bytes is not None and info.size > self.max_bytes):
            return None
        stem = self._stem(bucket, info.key)
        try:
            stem.parent.mkdir(parents=True, exist_ok=True)
            return Fill(self, bucket, info, stem)
        except OSError as exc:
            log.warning("node cache %s: not keeping %s: %s", self.root, info.key, exc)
            return None

    def entries(self) -> list[CacheEntry]:
        """Every kept file, least recently used first."""
        out = []
        for meta_path in (self.root / "objects").glob("*/*.json"):
            meta = _read_meta(meta_path)
            data = meta_path.with_suffix(".data")
            if meta is None or _size(data) is None:
                continue
            with contextlib.suppress(OSError):
                used = meta_path.stat().st_mtime_ns
                out.append(CacheEntry(meta["key"], data, meta["size"], meta["etag"], used))
        return sorted(out, key=lambda e: e.used_ns)

    def evict(self, keep: Path | None = None) -> None:
        """Drop the least recently used files until the rest fit `max_bytes`; sweep dead partials."""
        cutoff = time.time() - STALE_PARTIAL_S
        for partial in (self.root / "objects").glob("*/*.partial.*"):
            with contextlib.suppress(OSError):
                if partial.stat().st_mtime < cutoff:
                    partial.unlink()
        if self.max_bytes is None:
            return
        entries = self.entries()
        total = sum(e.size for e in entries)
        for e in entries:
            if total <= self.max_bytes:
                break
            if e.path != keep:
                _remove(e.path.with_suffix(".json"), e.path)
                total -= e.size

    def _commit(self, fill: Fill) -> bool:
        """Move a complete fill into place, then its record; False when another filler of the
        same file finished first (it removed this one's partial: the rename fails, and its
        copy and record are left alone)."""
        data, meta = fill.stem.with_suffix(".data"), fill.stem.with_suffix(".json")
        record: dict[str, Any] = {
            "bucket": fill.bucket,
            "key": fill.info.key,
            "size": fill.info.size,
        }
        record["etag"] = fill.info.etag
        tmp_meta = fill.partial.with_name(fill.partial.name + ".json")
        try:
            os.fsync(fill.fd)
            os.rename(fill.partial, data)  # atomic: a reader holds the old file or the new one
        except OSError as exc:
            _remove(fill.partial)
            log.debug("node cache: fill of %s not kept: %s", fill.info.key, exc)
            return False
        try:
            tmp_meta.write_text(json.dumps(record))
            os.rename(tmp_meta, meta)
        except OSError as exc:  # no record: the copy is never served, and fetched again
            _remove(tmp_meta)
            log.warning("node cache %s: no record for %s: %s", self.root, fill.info.key, exc)
            return False
        for other in fill.stem.parent.glob(fill.stem.name + ".partial.*"):
            _remove(other)  # other fillers of this file: their rename fails, nothing is lost
        self.evict(keep=data)
        return True


class Fill:
    """One object's bytes being written to a private partial file as the loader reads them."""

    def __init__(self, cache: NodeCache, bucket: str, info: ObjectInfo, stem: Path) -> None:
        self.cache, self.bucket, self.info, self.stem = cache, bucket, info, stem
        self.partial = stem.with_name(f"{stem.name}.partial.{uuid.uuid4().hex}")
        self.fd = os.open(self.partial, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self.close = weakref.finalize(self, _close, self.fd)  # closes once, whoever calls first
        self._spans: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self.state = "filling"  # then "kept" or "dropped"

    def write(self, start: int, chunks: Sequence[bytes | memoryview]) -> None:
        """Record the bytes read at `start`; keep the file once every byte is in."""
        if self.state != "filling":
            return
        try:
            pos = start
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                done = 0
                while done < len(view):
                    done += os.pwrite(self.fd, view[done:], pos + done)
                pos += len(view)
        except OSError as exc:
            self.drop(f"write failed: {exc}")
            return
        with self._lock:
            self._spans = _merge([*self._spans, (start, pos)])
            complete = self._spans == [(0, self.info.size)] and self.state == "filling"
            if complete:
                self.state = "committing"
        if complete:
            self.state = "kept" if self.cache._commit(self) else "dropped"
            self.close()

    def drop(self, why: str) -> None:
        """Give the fill up (the load goes on from S3)."""
        log.warning("node cache %s: not keeping %s: %s", self.cache.root, self.info.key, why)
        self.state = "dropped"
        self.close()
        _remove(self.partial)


class CachedStore:
    """An `ObjectStore`'s reads, served from the node cache where it holds the current version
    of an object, and filling it where it does not."""

    def __init__(self, store: ObjectStore, cache: NodeCache) -> None:
        self.store, self.cache = store, cache
        self.bucket = store.bucket
        self._routes: dict[str, tuple[ObjectInfo, int | None, Fill | None]] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}

    @property
    def retries(self) -> int:
        """Transient S3 failures retried so far (the wrapped store's count)."""
        return self.store.retries

    def _route(self, key: str) -> tuple[ObjectInfo, int | None, Fill | None]:
        """(info, an open kept copy or None, the fill or None), decided once per key."""
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:  # one HEAD and one fill per key, whatever the threads
            got = self._routes.get(key)
            if got is not None and (got[2] is None or got[2].state != "kept"):
                return got
            return self._decide(key)

    def _decide(self, key: str) -> tuple[ObjectInfo, int | None, Fill | None]:
        info = self.store.stat(key)
        path = self.cache.lookup(self.bucket, info) if info.etag else None
        fd: int | None = None
        if path is not None:
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDONLY)
                weakref.finalize(self, _close, fd)
        fill = self.cache.start_fill(self.bucket, info) if fd is None else None
        self._routes[key] = (info, fd, fill)
        return info, fd, fill

    def forget(self, key: str) -> bool:
        """Drop the kept copy this store serves `key` from (it failed a check); True if one was."""
        with self._lock:
            got = self._routes.pop(key, None)
        if got is None or got[1] is None:
            return False
        self.cache.remove(self.bucket, key)
        return True

    def stat(self, key: str) -> ObjectInfo:
        """The object's info (one HEAD, shared with the cache's version check)."""
        return self._route(key)[0]

    def head(self, key: str) -> int:
        """The object's size in bytes."""
        return self.stat(key).size

    def find(self, key: str) -> ObjectInfo | None:
        """The object's info from a listing of its exact key (the store's); None if absent."""
        return self.store.find(key)

    def read_prefix(self, key: str, n: int) -> tuple[bytes, ObjectInfo]:
        """The object's first min(n, size) bytes and its info."""
        info, fd, fill = self._route(key)
        want = max(0, min(n, info.size))
        if fd is not None:
            buf = bytearray(want)
            _pread_into(fd, [memoryview(buf)], 0)
            return bytes(buf), info
        data = self.store.get_range(key, 0, want) if want else b""
        if fill is not None:
            fill.write(0, [data])
        return data, info

    def get_range_into(self, key: str, start: int, views: Sequence[memoryview]) -> None:
        """Fill `views` (in order) with the object's bytes from `start`."""
        _, fd, fill = self._route(key)
        if fd is not None:
            _pread_into(fd, views, start)
            return
        self.store.get_range_into(key, start, views)
        if fill is not None:
            fill.write(start, views)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """The object's bytes [start, end)."""
        if end < start:
            raise ValueError(f"bad range [{start}, {end})")
        buf = bytearray(end - start)
        self.get_range_into(key, start, [memoryview(buf)])
        return bytes(buf)


def _pread_into(fd: int, views: Sequence[memoryview], start: int) -> None:
    pos = start
    for v in views:
        view = memoryview(v).cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], pos + done)
            if got <= 0:
                raise OSError(f"node cache copy ended at byte {pos + done}")
            done += got
        pos += len(view)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _read_meta(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(meta, dict) and {"key", "size", "etag"} <= meta.keys()
    return meta if ok else None


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _remove(*paths: Path) -> None:
    for p in paths:
        with contextlib.suppress(OSError):
            p.unlink()


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
