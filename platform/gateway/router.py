"""Pick a replica for each request and fail over when one dies before its first token.

Each live replica of the deployment (from the registry) is scored from its `/state`
(`wire.ReplicaState`):

    score = 2.0 * lora_affinity + 1.5 * prefix_match + 1.0 * (1 - kv_cache_usage) - 1.0 * queue_load

`lora_affinity` is 1.0 when the adapter is resident in a GPU slot, 0.9 when this gateway
warmed it into the replica's host tier (`adapter_warmer.py`), 0.8 when a slot is free, 0.4
otherwise (an eviction is needed), 1.0 for base-model requests; `prefix_match` is
the share of the prompt the replica can serve from its prefix cache, as far as this gateway
knows: the prompt's KV block keys are computed with the engine's own hash
(`wire.prefix_hash`), the `model_id` and `block_size` that replica reports, the adapter and
the cache salt, and matched against the keys this gateway has sent there. `queue_load` is the
replica's running + waiting requests over the busiest one's. Candidates are tried best first.

A base model may have several deployments (a bf16 one and an int4 one; an old version and
its replacement): resolution publishes them as a group under the oldest's name
(`resolve.publish_group`), and the router takes the live replicas of every deployment in the
group as candidates, scored alike: traffic follows capacity (more replicas, shorter queues
take more), an oldest deployment scaled to zero does not answer 503 while another has
replicas, and a switch from one deployment to another drops no request. The gateway passes
the group it resolved (`routes`, with the operator's weights: `deployment_choice.py`); the
Redis group serves callers that pass none.

Cold starts: when a deployment has no live replica but some are starting (announced by their
heartbeat, not healthy yet), a request waits up to the deployment's `cold_start_wait_s` for
the first one to be ready instead of failing at once; the wait is part of its time to first
token and is measured (`GatewayMetrics.cold_start_wait`). Past the bound: 503 + Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field

from loraplex.platform.errors import GENERIC_MESSAGE, LoraplexError
from loraplex.platform.gateway.deployment_choice import DeploymentRoute, order_by_weight
from loraplex.platform.gateway.errors import no_replica, still_starting
from loraplex.platform.gateway.metrics import GatewayMetrics
from loraplex.platform.gateway.replica_client import ReplicaClient, ReplicaSlow, ReplicaUnavailable
from loraplex.platform.gateway.replicas import ReplicaInfo, ReplicaRegistry
from loraplex.platform.gateway.resolve import group_key
from loraplex.platform.wire import DeltaEvent, FinishEvent, GenerateRequest, ReplicaState
from loraplex.platform.wire.prefix_hash import block_hashes, max_cached_blocks

W_LORA, W_PREFIX, W_KV, W_QUEUE = 2.0, 1.5, 1.0, 1.0
COLD_START_POLL_S = (0.05, 0.5)
WARMED_KEPT = 10_000  # first and longest pause between looks at the registry
log = logging.getLogger(__name__)


@dataclass
class ReplicaLoad:
    """What the router reads from a replica's `/state`."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    resident: set[str] = field(default_factory=set)
    free_slots: float = 0.0
    model_id: str = ""
    block_size: int = 1
    prefix_caching: bool = True

    @classmethod
    def from_state(cls, state: ReplicaState) -> ReplicaLoad:
        """The load of one replica from its `/state`."""
        resident = set(state.resident_adapters)
        return cls(
            running=float(state.num_requests_running),
            waiting=float(state.num_requests_waiting),
            kv_usage=state.kv_cache_usage,
            resident=resident,
            free_slots=float(max(state.max_loras - len(resident), 0)),
            model_id=state.model_id,
            block_size=state.block_size,
            prefix_caching=state.prefix_caching,
        )


class PromptKeys:
    """A prompt's block keys for one (model id, block size), computed once per routing."""

    def __init__(self, req: GenerateRequest, adapter_key: str | None) -> None:
        self._req = req
        self._adapter_key = adapter_key
        self._keys: dict[tuple[str, int], list[bytes]] = {}

    @property
    def num_tokens(self) -> int:
        """Prompt length."""
        return len(self._req.prompt_token_ids)

    @property
    def cacheable(self) -> bool:
        """The replica skips its prefix cache for requests asking for prompt logprobs."""
        return self._req.sampling.prompt_logprobs is None

    def for_replica(self, load: ReplicaLoad) -> list[bytes]:
        """The keys that replica gives the prompt's full blocks."""
        where = (load.model_id, load.block_size)
        if where not in self._keys:
            self._keys[where] = block_hashes(
                self._req.prompt_token_ids,
                load.block_size,
                load.model_id,
                self._adapter_key,
                self._req.cache_salt,
            )
        return self._keys[where]


class PrefixIndex:
    """Per-replica LRU of block keys this gateway has sent there (bounded)."""

    def __init__(self, capacity: int = 50_000) -> None:
        self._cap = capacity
        self._seen: dict[str, OrderedDict[bytes, None]] = {}

    def leading(self, replica_id: str, keys: Sequence[bytes]) -> int:
        """How many of `keys`, from the first, were sent to `replica_id`."""
        seen = self._seen.get(replica_id)
        if not seen:
            return 0
        n = 0
        for h in keys:
            if h not in seen:
                break
            n += 1
        return n

    def record(self, replica_id: str, keys: Sequence[bytes]) -> None:
        """Remember that `keys` now live on `replica_id`."""
        seen = self._seen.setdefault(replica_id, OrderedDict())
        for h in keys:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > self._cap:
            seen.popitem(last=False)

    def forget(self, replica_id: str) -> None:
        """Drop a replica (it died: its cache is gone)."""
        self._seen.pop(replica_id, None)


@dataclass
class Scored:
    """A candidate replica with its score and the parts of it; `cached_tokens` is how many
    prompt tokens it is predicted to serve from its prefix cache."""

    replica: ReplicaInfo
    score: float
    load: ReplicaLoad
    prefix: float
    cached_tokens: int = 0
    keys: list[bytes] = field(default_factory=list)


@dataclass(frozen=True)
class Dispatch:
    """Where one attempt of a request went, with the router's cache prediction."""

    replica: ReplicaInfo
    request_id: str
    predicted_cached_tokens: int


def score(
    load: ReplicaLoad, adapter_key: str | None, prefix: float, max_queue: float, warm: bool = False
) -> float:
    """The routing score of one replica (higher is better); `warm`: the adapter was warmed
    into its host tier."""
    if adapter_key is None or adapter_key in load.resident:
        affinity = 1.0
    elif warm:
        affinity = 0.9
    elif load.free_slots > 0:
        affinity = 0.8
    else:
        affinity = 0.4
    queue = (load.running + load.waiting) / max(max_queue, 1.0)
    return W_LORA * affinity + W_PREFIX * prefix + W_KV * (1.0 - load.kv_usage) - W_QUEUE * queue


class ReplicaLost(LoraplexError):
    """The replica died after tokens were already sent: a 502 (an error event in a stream)
    with the generic message; what happened (`detail`) is logged."""

    def __init__(self, detail: str) -> None:
        super().__init__(GENERIC_MESSAGE, status=502, code="replica_lost", detail=detail)


class Router:
    """Scores live replicas, dispatches to the best, fails over before the first token."""

    def __init__(
        self,
        registry: ReplicaRegistry,
        client: ReplicaClient,
        *,
        state_ttl_s: float = 0.2,
        max_stale_s: float = 2.0,
        down_cooldown_s: float = 2.0,
        metrics: GatewayMetrics | None = None,
        rng: random.Random | None = None,
        hold_at_zero: bool = False,
    ) -> None:
        self.registry = registry
        # Hold a request even when nothing is starting: something (KEDA, on the count of
        # held requests) scales the deployment from zero meanwhile.
        self.hold_at_zero = hold_at_zero
        self._rng = rng or random.Random()
        self.client = client
        self.metrics = metrics or GatewayMetrics()
        self.prefixes = PrefixIndex()
        self._state_ttl = state_ttl_s
        self._cooldown = down_cooldown_s
        self._max_stale = max_stale_s
        self._states: dict[str, tuple[float, ReplicaLoad]] = {}
        self._refreshing: dict[str, asyncio.Task[ReplicaLoad | None]] = {}
        self._down_until: dict[str, float] = {}
        self.inflight: dict[str, int] = {}
        # (replica id, adapter key) pairs this gateway warmed, most recent last (bounded).
        self._warmed: OrderedDict[tuple[str, str], None] = OrderedDict()

    def note_warmed(self, replica_id: str, adapter_key: str) -> None:
        """Remember that `adapter_key` was warmed on `replica_id` (scored as near-resident)."""
        self._warmed[(replica_id, adapter_key)] = None
        self._warmed.move_to_end((replica_id, adapter_key))
        while len(self._warmed) > WARMED_KEPT:
            self._warmed.popitem(last=False)

    def mark_down(self, replica: ReplicaInfo) -> None:
        """Skip `replica` for a while (it failed a request or its state)."""
        self._down_until[replica.replica_id] = time.monotonic() + self._cooldown
        self._states.pop(replica.replica_id, None)
        self.prefixes.forget(replica.replica_id)

    async def _load(self, replica: ReplicaInfo) -> ReplicaLoad | None:
        """The replica's load: its state while fresh (`state_ttl_s`); past that, the last
        state at once while one refresh (shared by every request that needs it) runs behind
        it, for up to `max_stale_s`; with nothing usable cached, that one refresh awaited."""
        now = time.monotonic()
        rid = replica.replica_id
        if self._down_until.get(rid, 0.0) > now:
            return None
        cached = self._states.get(rid)
        if cached and cached[0] > now:
            return cached[1]
        task = self._refreshing.get(rid)
        if task is None:
            task = asyncio.ensure_future(self._refresh(replica, cached))
            self._refreshing[rid] = task
            task.add_done_callback(functools.partial(self._refresh_done, rid))
        if cached is not None and cached[0] + self._max_stale > now:
            return cached[1]
        return await asyncio.shield(task)

    def _refresh_done(self, rid: str, task: asyncio.Task[ReplicaLoad | None]) -> None:
        if self._refreshing.get(rid) is task:
            del self._refreshing[rid]
        if not task.cancelled() and task.exception() is not None:
            log.warning("replica %s: reading its state failed: %r", rid, task.exception())

    async def _refresh(
        self, replica: ReplicaInfo, cached: tuple[float, ReplicaLoad] | None
    ) -> ReplicaLoad | None:
        """Read the replica's `/state` once and keep it (or mark the replica down)."""
        try:
            load = ReplicaLoad.from_state(await self.client.state(replica.url))
        except ReplicaSlow:
            # Busy, not dead: a loaded replica answers /state late. Route on what it said
            # last (its queue only grew), or, knowing nothing yet, on a full one's load: it
            # is queued on, never dropped (dropping it turned load into 503s).
            known = cached[1] if cached is not None else ReplicaLoad(kv_usage=1.0)
            if cached is None:
                known.prefix_caching = False  # its model id and block size are unknown
            self._states[replica.replica_id] = (time.monotonic() + self._state_ttl, known)
            return known
        except ReplicaUnavailable as exc:
            log.warning("replica %s skipped for %gs: %s", replica.replica_id, self._cooldown, exc)
            self.mark_down(replica)
            return None
        self._states[replica.replica_id] = (time.monotonic() + self._state_ttl, load)
        return load

    async def group(
        self, deployment: str, routes: Sequence[DeploymentRoute] | None = None
    ) -> list[str]:
        """The deployments serving `deployment`'s base model (itself first): `routes` when
        given, else the group a resolution published; itself alone when there is none."""
        if routes is not None:
            names = [r.name for r in routes]
        else:
            raw = await self.registry._redis.get(group_key(self.registry._prefix, deployment))
            names = [str(n) for n in json.loads(raw)] if raw else []
        return [deployment, *(n for n in names if n != deployment)]

    async def _live(
        self, deployment: str, routes: Sequence[DeploymentRoute] | None
    ) -> list[ReplicaInfo]:
        """Live replicas of every deployment in `deployment`'s group."""
        names = await self.group(deployment, routes)
        found = await asyncio.gather(*(self.registry.live(d) for d in names))
        return [r for replicas in found for r in replicas]

    async def _starting(self, deployment: str, routes: Sequence[DeploymentRoute] | None) -> int:
        """Starting replicas of every deployment in `deployment`'s group."""
        names = await self.group(deployment, routes)
        return sum(await asyncio.gather(*(self.registry.starting(d) for d in names)))

    async def candidates(
        self,
        deployment: str,
        adapter_key: str | None,
        prompt: PromptKeys,
        routes: Sequence[DeploymentRoute] | None = None,
    ) -> list[Scored]:
        """Live, answering replicas of `deployment` and its group, best first (after the
        operator's weights, when `routes` carry any)."""
        replicas = await self._live(deployment, routes)
        loads = await asyncio.gather(*(self._load(r) for r in replicas))
        pairs = []
        for r, lo in zip(replicas, loads, strict=True):
            if lo is None:
                continue
            # A burst lands between two state refreshes: count what this gateway has in
            # flight there so the burst spreads instead of herding onto one replica.
            mine = float(self.inflight.get(r.replica_id, 0))
            if mine > lo.running + lo.waiting:
                lo = dataclasses.replace(lo, running=mine, waiting=0.0)
            pairs.append((r, lo))
        max_queue = max((lo.running + lo.waiting for _, lo in pairs), default=0.0)
        num_tokens = prompt.num_tokens
        scored = []
        for replica, load in pairs:
            keys = prompt.for_replica(load)
            hit = 0
            if load.prefix_caching and prompt.cacheable:
                limit = max_cached_blocks(num_tokens, load.block_size)
                hit = self.prefixes.leading(replica.replica_id, keys[:limit])
            prefix = hit * load.block_size / num_tokens if num_tokens else 0.0
            scored.append(
                Scored(
                    replica,
                    score(
                        load,
                        adapter_key,
                        prefix,
                        max_queue,
                        warm=adapter_key is not None
                        and (replica.replica_id, adapter_key) in self._warmed,
                    ),
                    load,
                    prefix,
                    cached_tokens=hit * load.block_size,
                    keys=keys,
                )
            )
        scored.sort(key=lambda s: s.score, reverse=True)
        if routes is None:
            return scored
        return order_by_weight(scored, lambda s: s.replica.deployment, routes, self._rng)

    async def wait_for_ready(
        self,
        deployment: str,
        adapter_key: str | None,
        prompt: PromptKeys,
        bound_s: float,
        routes: Sequence[DeploymentRoute] | None = None,
    ) -> list[Scored]:
        """Candidates once a starting replica of `deployment` is ready, waiting up to
        `bound_s`; [] at once when none is starting (unless `hold_at_zero`). Raises 503
        (`replicas_starting`, with Retry-After) when the bound passes first. The wait counts
        in `requests_waiting`, which wakes a deployment scaled to zero."""
        if bound_s <= 0:
            return []
        if not self.hold_at_zero and await self._starting(deployment, routes) == 0:
            return []
        with self.metrics.waiting(deployment):
            return await self._wait(deployment, adapter_key, prompt, bound_s, routes)

    async def _wait(
        self,
        deployment: str,
        adapter_key: str | None,
        prompt: PromptKeys,
        bound_s: float,
        routes: Sequence[DeploymentRoute] | None,
    ) -> list[Scored]:
        began = time.monotonic()
        pause = COLD_START_POLL_S[0]
        while True:
            await asyncio.sleep(min(pause, max(0.0, began + bound_s - time.monotonic())))
            pool = await self.candidates(deployment, adapter_key, prompt, routes)
            waited = time.monotonic() - began
            if pool:
                self.metrics.cold_start_wait.labels(deployment, "ready").observe(waited)
                return pool
            gone = not self.hold_at_zero and await self._starting(deployment, routes) == 0
            if waited >= bound_s or gone:
                outcome = "timeout" if waited >= bound_s else "gone"
                self.metrics.cold_start_wait.labels(deployment, outcome).observe(waited)
                if outcome == "gone":  # the starting replica died: nothing is coming
                    return []
                self.metrics.cold_start_timeouts.labels(deployment).inc()
                raise still_starting(waited)
            pause = min(pause * 2, COLD_START_POLL_S[1])

    async def generate(
        self,
        deployment: str,
        req: GenerateRequest,
        adapter_key: str | None,
        on_dispatch: Callable[[Dispatch], None] | None = None,
        cold_start_wait_s: float = 0.0,
        routes: Sequence[DeploymentRoute] | None = None,
    ) -> AsyncGenerator[DeltaEvent | FinishEvent, None]:
        """Stream `req` from the best replica; retry on the next one until a token arrives.

        `on_dispatch` is told where each attempt runs (for aborts) and what the router
        predicted it has cached. `routes`: the deployments of the base model, with the
        operator's weights (else the published group). With no live replica but some starting, waits up to
        `cold_start_wait_s` for one (see the module docstring). Raises 503 when no replica can
        take it, `ReplicaLost` when one dies mid-stream.
        """
        prompt = PromptKeys(req, adapter_key)
        tried: set[str] = set()
        last_error = "no live replica"
        for attempt in range(4):
            pool = [
                c
                for c in await self.candidates(deployment, adapter_key, prompt, routes)
                if c.replica.replica_id not in tried
            ]
            if not pool and attempt == 0:
                pool = await self.wait_for_ready(
                    deployment, adapter_key, prompt, cold_start_wait_s, routes
                )
            if not pool:
                break
            best = pool[0]
            chosen = best.replica
            tried.add(chosen.replica_id)
            attempt_req = (
                req
                if attempt == 0
                else req.model_copy(update={"request_id": f"{req.request_id}-r{attempt}"})
            )
            if on_dispatch is not None:
                on_dispatch(Dispatch(chosen, attempt_req.request_id, best.cached_tokens))
            if best.load.prefix_caching and prompt.cacheable:
                self.prefixes.record(chosen.replica_id, best.keys)
            started = False
            self.inflight[chosen.replica_id] = self.inflight.get(chosen.replica_id, 0) + 1
            try:
                async with contextlib.aclosing(
                    self.client.generate(chosen.url, attempt_req)
                ) as stream:
                    async for event in stream:
                        started = True
                        yield event
                return
            except ReplicaUnavailable as exc:
                self.mark_down(chosen)
                if started:
                    raise ReplicaLost(str(exc)) from exc
                last_error = str(exc)
            finally:
                self.inflight[chosen.replica_id] -= 1
        raise no_replica(f"no replica could serve the request: {last_error}")


__all__ = ["Dispatch", "ReplicaLost", "Router", "Scored", "score"]
