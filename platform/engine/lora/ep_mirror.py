"""Multi-LoRA under expert parallelism: the follower ranks hold the adapters rank 0 runs.

Rank 0's runtime admits, fetches and loads adapters as usual; it reads each adapter whole, as
only a whole file can be checked against the version's sha256. Every adapter it copies to its
device is sent once to the followers with the next step's batch, without its per-expert factors
(`expert_slices.without_expert_rows`); then each follower gets, point to point, only the rows
of the experts it holds (`ExpertRows`), and after an EPLB rebalance only the rows of the
experts it newly holds. The keys rank 0 no longer holds are sent so followers forget them. A
follower keeps what it was sent, and before each forward makes the step's adapters resident in
its own pool (the same size as rank 0's, so what fits there fits here) and holds them for the
forward: every rank applies the same adapters to the same tokens (attention LoRA on each rank's
replica, expert LoRA on each rank's own experts, rows carrying their adapter slot through the
all-to-all).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from loraplex.adapters.expert_weights import ExpertLoraModule
from loraplex.adapters.weights import LoadedAdapter
from loraplex.moe.ep_launch import StepChannel
from loraplex.moe.expert_parallel import process_ep_group
from loraplex.platform.engine.lora.expert_slices import (
    ExpertRows,
    expert_rows,
    put_expert_rows,
    with_room_for_rows,
    without_expert_rows,
)
from loraplex.platform.engine.lora.runtime import LoraRuntime
from loraplex.platform.engine.request import Request


@dataclass
class AdapterUpdates:
    """What changed on rank 0's device since the last step: adapters loaded (without their
    per-expert rows), keys dropped, and whether each follower's rows follow point to point."""

    loaded: list[LoadedAdapter] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    rows_follow: bool = False


def _channel() -> StepChannel | None:
    ep = process_ep_group()
    return StepChannel(ep) if ep is not None else None


class LeaderMirror:
    """Rank 0: collects the adapters its tiers load, and each follower's expert rows."""

    def __init__(self, runtime: LoraRuntime) -> None:
        self.runtime = runtime
        self._new: list[LoadedAdapter] = []
        self._sent: set[str] = set()
        self._experts: dict[str, dict[int, ExpertLoraModule]] = {}  # whole, by key and layer
        self._given: dict[tuple[int, str, int], set[int]] = {}  # (rank, key, layer) -> experts
        self.sent_expert_bytes: Counter[int] = Counter()  # per follower rank
        self.channel = _channel()
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
        for key in dropped:
            self._experts.pop(key, None)
            for given in [g for g in self._given if g[1] == key]:
                del self._given[given]
        for adapter in loaded:
            if adapter.experts:
                self._experts[adapter.key] = adapter.experts
        stubs = [without_expert_rows(a) for a in loaded]
        return AdapterUpdates(stubs, dropped, rows_follow=self.channel is not None)

    def send_rows(self) -> None:
        """Right after the step's broadcast: each follower's missing expert rows, to it alone."""
        if self.channel is None:
            return
        world = self.channel.ep.world_size
        self.channel.send_each([None] + [self._rows_for(r) for r in range(1, world)])

    def _rows_for(self, rank: int) -> dict[str, dict[int, ExpertRows]]:
        """The rows of the experts `rank` holds now and was not sent yet, per adapter and layer."""
        out: dict[str, dict[int, ExpertRows]] = {}
        store = self.runtime.experts
        if store is None:
            return out
        for key, layers in self._experts.items():
            for block in store.blocks:
                module = layers.get(block.layer_idx)
                if module is None or block.placement is None:
                    continue
                given = self._given.setdefault((rank, key, block.layer_idx), set())
                need = sorted(set(block.placement.local_experts(rank)) - given)
                if need:
                    rows = expert_rows(module, need)
                    out.setdefault(key, {})[block.layer_idx] = rows
                    given.update(need)
                    self.sent_expert_bytes[rank] += rows.nbytes
        return out


class FollowerMirror:
    """A follower rank: the adapters rank 0 sent, made resident for the steps that use them."""

    def __init__(self, runtime: LoraRuntime) -> None:
        self.runtime = runtime
        self.adapters: dict[str, LoadedAdapter] = {}
        self._held: dict[tuple[str, int], set[int]] = {}  # (key, layer) -> experts with rows
        self.channel = _channel()

    def _num_experts(self) -> dict[int, int]:
        store = self.runtime.experts
        return {} if store is None else {b.layer_idx: b.spec.num_experts for b in store.blocks}

    def apply(self, updates: AdapterUpdates) -> None:
        """Keep the adapters rank 0 loaded and the expert rows it sent this rank; forget the
        ones it dropped."""
        for adapter in updates.loaded:
            self.adapters[adapter.key] = with_room_for_rows(adapter, self._num_experts())
        if updates.rows_follow and self.channel is not None:
            mine: dict[str, dict[int, ExpertRows]] = self.channel.receive_own() or {}
            store = self.runtime.experts
            for key, layers in mine.items():
                adapter = self.adapters[key]
                for layer, rows in layers.items():
                    put_expert_rows(adapter.experts[layer], rows)
                    self._held.setdefault((key, layer), set()).update(rows.experts)
                if store is not None and key in store:
                    store.refresh(key)
        pool = self.runtime.tiers.pool
        for key in updates.dropped:
            self.adapters.pop(key, None)
            for held in [h for h in self._held if h[0] == key]:
                del self._held[held]
            entry = pool.get(key)
            if entry is not None and entry.refs == 0:
                pool.evict(key)
        store = self.runtime.experts
        if store is not None:
            for key in store.held_keys():
                self._check_rows(key)

    def _check_rows(self, key: str) -> None:
        """Refuse to run an adapter on experts this rank has no rows of (never zeros)."""
        store, adapter = self.runtime.experts, self.adapters.get(key)
        if store is None or adapter is None:
            return
        for block in store.blocks:
            if block.layer_idx not in adapter.experts:
                continue
            missing = set(block.local_experts) - self._held.get((key, block.layer_idx), set())
            if missing:
                raise RuntimeError(
                    f"adapter {key[:12]}: this rank holds experts {sorted(missing)} of layer "
                    f"{block.layer_idx} but rank 0 sent no rows for them"
                )

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
                    self._check_rows(key)
                    self.runtime.experts.add(adapter)
            pool.acquire(key)
            held.append(key)
        return held

    def release(self, keys: list[str]) -> None:
        """The forward is done: drop the holds `hold` took."""
        pool = self.runtime.tiers.pool
        for key in keys:
            pool.release(key)
