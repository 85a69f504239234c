"""The host-memory tier: validated adapters kept in RAM, bounded in bytes, evicted LRU.

Keyed by adapter version (sha256), never by name, so a re-uploaded adapter is a different
entry and can never be served from a stale one. Thread-safe: the background fetcher puts,
the engine thread gets.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from loraplex.adapters.weights import LoadedAdapter


class AdapterTooLargeError(ValueError):
    """An adapter is larger than the whole tier it is meant to live in."""


@dataclass
class HostCacheStats:
    """Counters for /metrics."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0


class HostCache:
    """LRU of `LoadedAdapter`s whose total `nbytes` never exceeds `capacity_bytes`."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"host cache capacity must be positive, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[str, LoadedAdapter] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.stats = HostCacheStats()

    @property
    def used_bytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[str]:
        """Keys from least to most recently used."""
        with self._lock:
            return list(self._entries)

    def get(self, key: str) -> LoadedAdapter | None:
        """The adapter under `key` (now most recently used), or None."""
        with self._lock:
            adapter = self._entries.get(key)
            if adapter is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return adapter

    def put(self, adapter: LoadedAdapter) -> list[str]:
        """Insert (or refresh) an adapter, evicting LRU entries to fit; returns evicted keys."""
        size = adapter.nbytes
        if size > self.capacity_bytes:
            raise AdapterTooLargeError(
                f"adapter {adapter.key[:12]} needs {size} bytes; the host tier holds "
                f"{self.capacity_bytes}"
            )
        evicted: list[str] = []
        with self._lock:
            old = self._entries.pop(adapter.key, None)
            if old is not None:
                self._bytes -= old.nbytes
            while self._entries and self._bytes + size > self.capacity_bytes:
                key, victim = self._entries.popitem(last=False)
                self._bytes -= victim.nbytes
                self.stats.evictions += 1
                evicted.append(key)
            self._entries[adapter.key] = adapter
            self._bytes += size
        return evicted

    def discard(self, key: str) -> bool:
        """Drop `key` if present; True when something was dropped."""
        with self._lock:
            adapter = self._entries.pop(key, None)
            if adapter is None:
                return False
            self._bytes -= adapter.nbytes
            return True
