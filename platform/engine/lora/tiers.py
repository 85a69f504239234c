"""The three adapter tiers as the admission policy sees them: object storage (through the
fetcher) -> host LRU (`adapters.host_cache`) -> device pages (`adapters.device_pool`).

Implements `admission.AdapterTiers`: is an adapter's weights here yet (starting the fetch if
not), could the device take it, make it resident while requests run, release it after. An
adapter found on the host is "staged" (held) until its first request is admitted, so the
host LRU cannot drop it in between. Requests whose adapter failed to load are collected for
the engine to finish.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
from loraplex.adapters.host_cache import HostCache
from loraplex.adapters.weights import LoadedAdapter
from loraplex.platform.engine.lora.fetcher import AdapterFetcher
from loraplex.platform.engine.request import Request

log = logging.getLogger(__name__)


class LoraTiers:
    """Host and device tiers of one replica, fed by `fetcher` (see the module docstring)."""

    def __init__(
        self,
        specs: list[LoraLinearSpec],
        host: HostCache,
        fetcher: AdapterFetcher,
        *,
        max_lora_rank: int,
        adapter_memory_bytes: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.specs = specs
        self.host = host
        self.fetcher = fetcher
        self.max_lora_rank = max_lora_rank
        self.adapter_memory_bytes = adapter_memory_bytes
        self.dtype = dtype
        self.device = device
        self._pool: DevicePool | None = None
        self._staged: dict[str, LoadedAdapter] = {}
        self._failed_requests: list[str] = []
        # Called with each adapter copied to the device (the runtime's expert-LoRA store).
        self.on_device_load: Callable[[LoadedAdapter], None] | None = None

    @property
    def pool(self) -> DevicePool:
        """The device pool, allocated on first use."""
        if self._pool is None:
            self._pool = DevicePool(
                self.specs,
                self.adapter_memory_bytes,
                self.max_lora_rank,
                dtype=self.dtype,
                device=self.device,
            )
        return self._pool

    @property
    def allocated_pool(self) -> DevicePool | None:
        """The device pool if it exists yet (reading it never allocates)."""
        return self._pool

    def is_resident(self, key: str) -> bool:
        """Is the adapter in device memory?"""
        return self._pool is not None and key in self._pool

    # -- AdapterTiers (used by the admission policy) ------------------------------------

    def ready_rows(self, key: str) -> int | None:
        """Device rows the adapter needs if its weights are here; None while fetching."""
        self.fetcher.raise_if_failed(key)
        if self._pool is not None and key in self._pool:
            return self._pool.get(key).rows  # type: ignore[union-attr]
        adapter = self._staged.get(key) or self.host.get(key)
        if adapter is not None:
            self._staged[key] = adapter  # keep it alive until activation
            return adapter.max_rank
        if self.fetcher.collect(key):
            return self.ready_rows(key)
        self.fetcher.prefetch(key)
        return None

    def is_ready(self, key: str) -> bool:
        """Weights on the host or device already (no fetch needed)?"""
        return self.is_resident(key) or key in self._staged or key in self.host

    def can_hold(self, key: str, rows: int) -> bool:
        """Could the device pool take the adapter now?"""
        return self.pool.can_hold(rows, key)

    def activate(self, key: str) -> None:
        """Copy host -> device if needed, then hold the adapter while requests run."""
        pool = self.pool
        if key not in pool:
            adapter = self._staged.pop(key, None) or self.host.get(key)
            if adapter is None:
                raise RuntimeError(f"adapter {key[:12]} admitted without its weights on the host")
            pool.load(adapter)
            if self.on_device_load is not None:
                self.on_device_load(adapter)
        self._staged.pop(key, None)
        pool.acquire(key)

    def deactivate(self, key: str) -> None:
        """Drop the hold; the adapter stays resident until LRU eviction needs its rows."""
        self.pool.release(key)

    def fail_request(self, request: Request, error: BaseException) -> None:
        """Remember a request whose adapter cannot be loaded; the engine aborts it next step."""
        log.warning("adapter %s failed to load: %s", (request.adapter_key or "")[:12], error)
        self._failed_requests.append(request.request_id)

    # -- for the runtime -----------------------------------------------------------------

    def take_failed_request_ids(self) -> list[str]:
        """Requests to abort because their adapter failed to load (cleared on read)."""
        out, self._failed_requests = self._failed_requests, []
        return out

    def unstage_except(self, waiting: set[str] | dict[str, object]) -> None:
        """Drop staged adapters no waiting request wants any more."""
        for key in [k for k in self._staged if k not in waiting]:
            del self._staged[key]
