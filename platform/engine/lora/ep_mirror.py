"""Multi-LoRA under expert parallelism: the follower ranks hold the adapters rank 0 runs.

Rank 0's runtime admits, fetches and loads adapters as usual. Every adapter it copies to its
device is sent once to the followers with the next step's batch (its loaded host copy), and
the keys it no longer holds are sent so followers forget them. A follower keeps what it was
sent, and before each forward makes the step's adapters resident in its own pool (the same
size as rank 0's, so what fits there fits here) and holds them for the forward: every rank
applies the same adapters to the same tokens (attention LoRA on each rank's replica, expert
LoRA on each rank's own experts, rows carrying their adapter slot through the all-to-all).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from loraplex.adapters.weights import LoadedAdapter
from loraplex.platform.engine.lora.runtime import LoraRuntime
from loraplex.platform.engine.request import Request


@dataclass
class AdapterUpdates:
    """What changed on rank 0's device since the last step: adapters loaded, keys dropped."""

    loaded: list[LoadedAdapter] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


class LeaderMirror:
    """Rank 0: collects the adapters its tiers load, for the followers."""

    def __init__(self, runtime: LoraRuntime) -> None:
        self.runtime = runtime
        self._new: list[LoadedAdapter] = []
        self._sent: set[str] = set()
        previous = runtime.tiers.on_device_load

        def on_load(adapter: LoadedAdapter) -> None:
            if previous is not None:
                previous(adapter)
            self._new.append(adapter)

        runtime.tiers.on_device_load = on_load

    def updates(self) -> AdapterUpdates:
        """The adapters to send with this step and the keys the followers may drop."""
        pool = self.runtime.tiers.allocated_pool
        resident = set(pool.keys()) if pool is not None else set()
        loaded, self._new = self._new, []
        fresh = {a.key for a in loaded}
        dropped = sorted(self._sent - resident - fresh)
        self._sent = (self._sent - set(dropped)) | fresh
        return AdapterUpdates(loaded, dropped)


class FollowerMirror:
    """A follower rank: the adapters rank 0 sent, made resident for the steps that use them."""

    def __init__(self, runtime: LoraRuntime) -> None:
        self.runtime = runtime
        self.adapters: dict[str, LoadedAdapter] = {}

    def apply(self, updates: AdapterUpdates) -> None:
        """Keep the adapters rank 0 loaded; forget the ones it dropped."""
        for adapter in updates.loaded:
            self.adapters[adapter.key] = adapter
        pool = self.runtime.tiers.pool
        for key in updates.dropped:
            self.adapters.pop(key, None)
            entry = pool.get(key)
            if entry is not None and entry.refs == 0:
                pool.evict(key)

    def hold(self, requests: Iterable[Request]) -> list[str]:
        """Make the step's adapters resident and hold them; returns the keys to release."""
        keys = sorted({r.adapter_key for r in requests if r.adapter_key is not None})
        pool = self.runtime.tiers.pool
        held = []
        for key in [k for k in keys if k in pool] + [k for k in keys if k not in pool]:
            if key not in pool:
                adapter = self.adapters.get(key)
                if adapter is None:
                    raise RuntimeError(f"adapter {key[:12]} runs on rank 0 but was never sent")
                pool.load(adapter)
                if self.runtime.experts is not None:
                    self.runtime.experts.add(adapter)
            pool.acquire(key)
            held.append(key)
        return held

    def release(self, keys: list[str]) -> None:
        """The forward is done: drop the holds `hold` took."""
        pool = self.runtime.tiers.pool
        for key in keys:
            pool.release(key)
