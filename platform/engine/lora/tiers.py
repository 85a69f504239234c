"""The three adapter tiers as the admission policy sees them: object storage (through the
fetcher) -> host LRU (`adapters.host_cache`) -> device pages (`adapters.device_pool`).

Implements `admission.AdapterTiers`: is an adapter's weights here yet (starting the fetch if
not), could the device take it, make it resident while requests run, release it after. On a
MoE base, "could the device take it" also asks the expert-LoRA store's byte budget: the factors
of adapters in use plus the newcomer's must fit, and idle resident adapters are evicted to make
room when it loads. An
adapter found on the host is "staged" (held) until its first request is admitted, so the
host LRU cannot drop it in between. Requests whose adapter failed to load are collected for
the engine to finish.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container

import torch

from loraplex.adapters.device_pool import DevicePool, LoraLinearSpec
from loraplex.adapters.host_cache import HostCache
from loraplex.adapters.weights import LoadedAdapter
from loraplex.platform.engine.lora.expert_lora import ExpertLoraStore
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
        # Called with each adapter copied to the device.
        self.on_device_load: Callable[[LoadedAdapter], None] | None = None
        # A MoE base's expert/router factors (set by the runtime): their bytes count too.
        self.experts: ExpertLoraStore | None = None

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
            return self._pool.get(key).rows  # type: ignore[union-attr]  # `key in` the pool (above)
        adapter = self._staged.get(key) or self.host.get(key)
        if adapter is not None:
            self._check_expert_bytes(adapter)
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
        """Could the device take the adapter now: its rank rows in the pool and, on a MoE
        base, its expert factors beside those of the adapters running requests?"""
        if not self.pool.can_hold(rows, key):
            return False
        experts = self.experts
        if experts is None or key in experts:
            return True
        adapter = self._staged.get(key) or self.host.get(key)
        need = experts.bytes_for(adapter) if adapter is not None else 0
        return self._busy_expert_bytes() + need <= experts.capacity_bytes

    def _busy_expert_bytes(self) -> int:
        """Expert-factor bytes of the adapters running requests (not evictable now)."""
        assert self.experts is not None
        pool = self.pool
        return sum(
            self.experts.nbytes_of(k)
            for k in self.experts.held_keys()
            if (r := pool.get(k)) is not None and r.refs > 0
        )

    def _check_expert_bytes(self, adapter: LoadedAdapter) -> None:
        """Refuse an adapter whose expert factors alone exceed the budget (it could never run)."""
        experts = self.experts
        if experts is None or adapter.key in experts:
            return
        need = experts.bytes_for(adapter)
        if need > experts.capacity_bytes:
            raise ValueError(
                f"adapter {adapter.key[:12]}'s expert LoRA takes {need} bytes on this replica, "
                f"more than its expert-LoRA memory of {experts.capacity_bytes} bytes"
            )

    def _make_expert_room(self, key: str) -> None:
        """Evict idle resident adapters (least recently used first) until the expert factors
        fit their budget again."""
        experts, pool = self.experts, self.pool
        if experts is None:
            return
        lru_first = pool.keys()
        for victim in lru_first:
            if experts.nbytes <= experts.capacity_bytes:
                return
            r = pool.get(victim)
            if victim != key and r is not None and r.refs == 0 and victim in experts:
                pool.evict(victim)
                experts.retain(pool.keys())

    def activate(self, key: str) -> None:
        """Copy host -> device if needed, then hold the adapter while requests run."""
        pool = self.pool
        if key not in pool:
            adapter = self._staged.pop(key, None) or self.host.get(key)
            if adapter is None:
                raise RuntimeError(f"adapter {key[:12]} admitted without its weights on the host")
            pool.load(adapter)
            if self.experts is not None:
                self.experts.retain(pool.keys())  # the load may have evicted some
                self.experts.add(adapter)
            if self.on_device_load is not None:
                self.on_device_load(adapter)
        self._staged.pop(key, None)
        pool.acquire(key)
        self._make_expert_room(key)

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

    def unstage_except(self, waiting: Container[str]) -> None:
        """Drop staged adapters no waiting request wants any more."""
        for key in [k for k in self._staged if k not in waiting]:
            del self._staged[key]
