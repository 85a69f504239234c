"""Pick a replica for each request and fail over when one dies before its first token.

Each live replica of the deployment (from the registry) is scored from its `/state`:

    score = 2.0 * lora_affinity + 1.5 * prefix_match + 1.0 * (1 - kv_usage) - 1.0 * queue_load

`lora_affinity` is 1.0 when the adapter is resident in a GPU slot, 0.8 when a slot is
free, 0.4 otherwise (an eviction is needed), 1.0 for base-model requests; `prefix_match`
is the share of the prompt's leading KV blocks this gateway last sent to that replica (the
same chained block hashes the engine keys its prefix cache by, salted by adapter and
tenant); `queue_load` is the replica's running + waiting requests over the busiest one's.
Candidates are tried best first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loraplex.platform.gateway.errors import GatewayError, no_replica
from loraplex.platform.gateway.replica_client import (
    GenerateRequest,
    ReplicaClient,
    ReplicaUnavailable,
    TokenDelta,
)
from loraplex.platform.gateway.replicas import ReplicaInfo, ReplicaRegistry

W_LORA, W_PREFIX, W_KV, W_QUEUE = 2.0, 1.5, 1.0, 1.0


def _num(state: dict[str, Any], *names: str, default: float = 0.0) -> float:
    for name in names:
        value: Any = state
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            return float(value)
    return default


def _adapter_keys(state: dict[str, Any]) -> set[str]:
    raw: Any = None
    for name in ("resident_adapters", "adapters", "lora.resident", "loras"):
        value: Any = state
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            raw = value
            break
    keys: set[str] = set()
    if isinstance(raw, dict):
        raw = list(raw.values()) if all(isinstance(v, dict) for v in raw.values()) else list(raw)
    for item in raw or []:
        if isinstance(item, str):
            keys.add(item)
        elif isinstance(item, dict):
            key = item.get("key") or item.get("sha256") or item.get("adapter_key")
            if isinstance(key, str):
                keys.add(key)
    return keys


@dataclass
class ReplicaLoad:
    """What the router reads from a replica's `/state`."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    resident: set[str] = field(default_factory=set)
    free_slots: float = 0.0

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ReplicaLoad:
        """Parse `/state` (vLLM metric names, with a few nested spellings accepted)."""
        kv = _num(state, "kv_cache_usage_perc", "kv_cache_usage", "kv.usage")
        if kv > 1.0:
            kv /= 100.0
        resident = _adapter_keys(state)
        max_loras = _num(state, "max_loras", "lora.max_loras")
        free = _num(state, "free_adapter_slots", "lora.free_slots", default=-1.0)
        if free < 0:
            free = max(max_loras - len(resident), 0.0)
        return cls(
            running=_num(state, "num_requests_running", "running", "scheduler.running"),
            waiting=_num(state, "num_requests_waiting", "waiting", "scheduler.waiting"),
            kv_usage=min(max(kv, 0.0), 1.0),
            resident=resident,
            free_slots=free,
        )


def block_hashes(token_ids: Sequence[int], block_size: int, seed: str) -> list[bytes]:
    """Chained hashes of the prompt's full blocks, seeded by adapter and salt."""
    out: list[bytes] = []
    parent = hashlib.sha256(seed.encode()).digest()
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        h = hashlib.sha256(parent)
        h.update(",".join(map(str, token_ids[start : start + block_size])).encode())
        parent = h.digest()
        out.append(parent)
    return out


class PrefixIndex:
    """Per-replica LRU of block hashes this gateway has sent there (bounded)."""

    def __init__(self, capacity: int = 50_000) -> None:
        self._cap = capacity
        self._seen: dict[str, OrderedDict[bytes, None]] = {}

    def match(self, replica_id: str, hashes: list[bytes]) -> float:
        """Share of `hashes` (leading run) already sent to `replica_id`."""
        seen = self._seen.get(replica_id)
        if not hashes or not seen:
            return 0.0
        n = 0
        for h in hashes:
            if h not in seen:
                break
            n += 1
        return n / len(hashes)

    def record(self, replica_id: str, hashes: list[bytes]) -> None:
        """Remember that `hashes` now live on `replica_id`."""
        seen = self._seen.setdefault(replica_id, OrderedDict())
        for h in hashes:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self._cap:
            seen.popitem(last=False)

    def forget(self, replica_id: str) -> None:
        """Drop a replica (it died: its cache is gone)."""
        self._seen.pop(replica_id, None)


@dataclass
class Scored:
    """A candidate replica with its score and the parts of it."""

    replica: ReplicaInfo
    score: float
    load: ReplicaLoad
    prefix: float


def score(load: ReplicaLoad, adapter_key: str | None, prefix: float, max_queue: float) -> float:
    """The routing score of one replica (higher is better)."""
    if adapter_key is None or adapter_key in load.resident:
        affinity = 1.0
    elif load.free_slots > 0:
        affinity = 0.8
    else:
        affinity = 0.4
    queue = (load.running + load.waiting) / max(max_queue, 1.0)
    return W_LORA * affinity + W_PREFIX * prefix + W_KV * (1.0 - load.kv_usage) - W_QUEUE * queue


class ReplicaLost(Exception):
    """The replica died after tokens were already sent: the client gets an error event."""


class Router:
    """Scores live replicas, dispatches to the best, fails over before the first token."""

    def __init__(
        self,
        registry: ReplicaRegistry,
        client: ReplicaClient,
        *,
        block_size: int = 16,
        state_ttl_s: float = 0.2,
        down_cooldown_s: float = 2.0,
    ) -> None:
        self.registry = registry
        self.client = client
        self.block_size = block_size
        self.prefixes = PrefixIndex()
        self._state_ttl = state_ttl_s
        self._cooldown = down_cooldown_s
        self._states: dict[str, tuple[float, ReplicaLoad]] = {}
        self._down_until: dict[str, float] = {}
        self.inflight: dict[str, int] = {}

    def mark_down(self, replica: ReplicaInfo) -> None:
        """Skip `replica` for a while (it failed a request or its state)."""
        self._down_until[replica.replica_id] = time.monotonic() + self._cooldown
        self._states.pop(replica.replica_id, None)
        self.prefixes.forget(replica.replica_id)

    async def _load(self, replica: ReplicaInfo) -> ReplicaLoad | None:
        now = time.monotonic()
        if self._down_until.get(replica.replica_id, 0.0) > now:
            return None
        cached = self._states.get(replica.replica_id)
        if cached and cached[0] > now:
            return cached[1]
        try:
            load = ReplicaLoad.from_state(await self.client.state(replica.url))
        except ReplicaUnavailable:
            self.mark_down(replica)
            return None
        self._states[replica.replica_id] = (now + self._state_ttl, load)
        return load

    async def candidates(
        self, deployment: str, adapter_key: str | None, hashes: list[bytes]
    ) -> list[Scored]:
        """Live, answering replicas of `deployment`, best first."""
        replicas = await self.registry.live(deployment)
        loads = await asyncio.gather(*(self._load(r) for r in replicas))
        pairs = []
        for r, lo in zip(replicas, loads, strict=True):
            if lo is None:
                continue
            # A burst lands between two state refreshes: count what this gateway has in
            # flight there so the burst spreads instead of herding onto one replica.
            mine = float(self.inflight.get(r.replica_id, 0))
            if mine > lo.running + lo.waiting:
                lo = ReplicaLoad(mine, 0.0, lo.kv_usage, lo.resident, lo.free_slots)
            pairs.append((r, lo))
        max_queue = max((lo.running + lo.waiting for _, lo in pairs), default=0.0)
        scored = []
        for replica, load in pairs:
            prefix = self.prefixes.match(replica.replica_id, hashes)
            scored.append(
                Scored(replica, score(load, adapter_key, prefix, max_queue), load, prefix)
            )
        scored.sort(key=lambda s: s.score, reverse=True)
        return scored

    async def generate(
        self,
        deployment: str,
        req: GenerateRequest,
        adapter_key: str | None,
        on_dispatch: Callable[[ReplicaInfo, str], None] | None = None,
    ) -> AsyncIterator[TokenDelta]:
        """Stream `req` from the best replica; retry on the next one until a token arrives.

        `on_dispatch(replica, request_id)` is told where the request runs (for aborts).
        Raises 503 when no replica can take it, `ReplicaLost` when one dies mid-stream.
        """
        hashes = block_hashes(
            req.prompt_token_ids, self.block_size, f"{adapter_key}|{req.cache_salt}"
        )
        tried: set[str] = set()
        last_error = "no live replica"
        for attempt in range(4):
            pool = [
                c
                for c in await self.candidates(deployment, adapter_key, hashes)
                if c.replica.replica_id not in tried
            ]
            if not pool:
                break
            chosen = pool[0].replica
            tried.add(chosen.replica_id)
            attempt_req = GenerateRequest(
                request_id=req.request_id if attempt == 0 else f"{req.request_id}-r{attempt}",
                prompt_token_ids=req.prompt_token_ids,
                sampling_params=req.sampling_params,
                adapter=req.adapter,
                cache_salt=req.cache_salt,
            )
            if on_dispatch is not None:
                on_dispatch(chosen, attempt_req.request_id)
            self.prefixes.record(chosen.replica_id, hashes)
            started = False
            self.inflight[chosen.replica_id] = self.inflight.get(chosen.replica_id, 0) + 1
            try:
                async with contextlib.aclosing(
                    self.client.generate(chosen.url, attempt_req)
                ) as stream:
                    async for delta in stream:
                        started = True
                        yield delta
                return
            except ReplicaUnavailable as exc:
                self.mark_down(chosen)
                if started:
                    raise ReplicaLost(str(exc)) from exc
                last_error = str(exc)
            finally:
                self.inflight[chosen.replica_id] -= 1
        raise no_replica(f"No replica could serve the request ({last_error}).")


__all__ = ["GatewayError", "ReplicaLost", "Router", "Scored", "block_hashes", "score"]
