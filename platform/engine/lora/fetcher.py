"""Adapter sources and the background fetcher: references -> version keys -> the host tier.

A request names its adapter by reference (an `AdapterRef` in object storage, or, in-process
only, a local directory). `resolve` turns it into the version key at once (so the request can
be keyed before any bytes arrive) and remembers where the bytes come from (every tenant's
copy of identical bytes, `source_map.py`); `prefetch` then
reads, checks and parses them on one background thread into the host tier, while the engine
keeps stepping. A failed fetch is remembered until a new request for the key retries it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from loraplex.adapters.host_cache import HostCache
from loraplex.adapters.targets import ResolvedTargets
from loraplex.adapters.weights import LoadedAdapter, load_adapter
from loraplex.platform.engine.lora.source_map import SourceMap
from loraplex.platform.engine.lora.sources import (
    AdapterRef,
    DirSource,
    LocalAdapterRef,
    ObjectReader,
    ObjectSource,
)

# Where `AdapterFetcher.probe` is called on the fetch thread: before the bytes are read, before
# they are parsed into tensors (torch ops on this thread), before and after the host-tier insert.
FETCH_STAGES = ("read", "parse", "insert", "inserted")


class AdapterFetcher:
    """Knows every resolved adapter's source and brings its weights into the host tier."""

    def __init__(
        self,
        host: HostCache,
        hf_config: dict[str, Any],
        *,
        max_lora_rank: int,
        dtype: torch.dtype,
        object_store: ObjectReader | None = None,
        max_object_bytes: int,
        allow_local_paths: bool = True,
    ) -> None:
        self.host = host
        self.hf_config = hf_config
        self.max_lora_rank = max_lora_rank
        self.dtype = dtype
        self.object_store = object_store
        self.max_object_bytes = max_object_bytes  # each stored file's size limit
        # A replica serving HTTP must not read paths its callers name: refs only there.
        self.allow_local_paths = allow_local_paths
        # every copy of each version (one per tenant and place), so a deleted copy falls back
        self.sources = SourceMap()
        self.fetch_seconds: dict[str, float] = {}
        self._fetches: dict[str, Future[None]] = {}
        self._failed: dict[str, BaseException] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lora-fetch")
        # Called on the fetch thread at each point where a fetch touches shared state
        # (FETCH_STAGES, with the key): tests hold the thread there while the engine steps.
        self.probe: Callable[[str, str], None] | None = None
        # Called with each adapter's resolved targets as its reference is resolved (before any
        # request is queued): raises ValueError to refuse what this engine cannot serve.
        self.admit: Callable[[ResolvedTargets], None] | None = None

    def resolve(self, ref: object, resident: Callable[[str], bool]) -> tuple[str, str | None]:
        """A request's adapter reference -> (version key, tenant).

        A local directory is read and validated now (bad adapters fail the call at once) and
        lands in the host tier unless `resident(key)` (already on the device); an `AdapterRef`
        is fetched from object storage in the background when a request first needs it.
        """
        if isinstance(ref, dict):
            try:
                ref = AdapterRef(**ref)
            except TypeError as exc:
                raise ValueError(
                    "an adapter reference object takes object_prefix, sha256, and optionally "
                    "config_sha256, tenant and targets"
                ) from exc
        if isinstance(ref, AdapterRef):
            ref.check()
            self._admit(ref.resolved_targets())
            if self.object_store is None:
                raise ValueError("this engine has no object store to fetch adapters from")
            source = ObjectSource(ref, self.object_store, self.max_object_bytes)
            self.sources.add(source)
            self._failed.pop(source.key, None)  # a new request retries a failed fetch
            return source.key, ref.tenant
        if isinstance(ref, str | Path | LocalAdapterRef):
            if not self.allow_local_paths:
                raise ValueError("this engine takes adapter references to object storage only")
            path, tenant = (
                (ref.path, ref.tenant) if isinstance(ref, LocalAdapterRef) else (ref, None)
            )
            dir_source, cfg, weights = DirSource.open(path, tenant)
            if dir_source.key not in self.host and not resident(dir_source.key):
                adapter = self._load(cfg, weights, dir_source.key)
                self._admit(adapter.targets)
                self.host.put(adapter)
            elif self.admit is not None and (held := self.host.get(dir_source.key)) is not None:
                self._admit(held.targets)  # (a resident one was admitted when it was loaded)
            self.sources.add(dir_source)
            return dir_source.key, tenant
        raise TypeError(
            f"an adapter reference is a directory path, LocalAdapterRef or AdapterRef, not {ref!r}"
        )

    def _load(
        self, cfg: bytes, weights: bytes, key: str, targets: ResolvedTargets | None = None
    ) -> LoadedAdapter:
        return load_adapter(
            cfg, weights, self.hf_config, targets=targets, key=key,
            max_rank=self.max_lora_rank, dtype=self.dtype,
        )  # fmt: skip

    def _admit(self, targets: ResolvedTargets) -> None:
        if self.admit is not None:
            self.admit(targets)

    def _at(self, stage: str, key: str) -> None:
        if self.probe is not None:
            self.probe(stage, key)

    def _fetch(self, key: str) -> None:
        t0 = time.perf_counter()
        self._at("read", key)
        source, cfg, weights = self.sources.fetch(key)
        self._at("parse", key)
        # Object-store versions carry their resolved targets: no tenant pattern runs here.
        adapter = self._load(cfg, weights, key, getattr(source, "targets", None))
        self._at("insert", key)
        self.host.put(adapter)
        self._at("inserted", key)
        self.fetch_seconds[key] = time.perf_counter() - t0

    def prefetch(self, key: str) -> Future[None] | None:
        """Start bringing `key` into the host tier in the background (no-op when it is there)."""
        with self._lock:
            if key in self.host or key in self._fetches:
                return self._fetches.get(key)
            if key not in self.sources:
                raise KeyError(f"unknown adapter {key[:12]}: resolve it first")
            fut = self._executor.submit(self._fetch, key)
            self._fetches[key] = fut
            return fut

    def raise_if_failed(self, key: str) -> None:
        """Raise the error of `key`'s last fetch if it failed (until a request retries it)."""
        if key in self._failed:
            raise self._failed[key]

    def collect(self, key: str) -> bool:
        """True once `key`'s background fetch has finished well (its weights are on the host);
        False while none ran or it still runs. Raises (and remembers) the fetch's error."""
        fut = self._fetches.get(key)
        if fut is None or not fut.done():
            return False
        self._fetches.pop(key, None)
        error = fut.exception()
        if error is not None:
            self._failed[key] = error
            raise error
        return True

    def close(self) -> None:
        """Stop the fetch thread (queued fetches are cancelled)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
