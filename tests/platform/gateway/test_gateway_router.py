"""Replica scoring and failover: adapter residency and cached prefix against queue depth and
KV use; a replica failing before the first token is retried elsewhere, after it the caller
gets `ReplicaLost`; no replica is a 503."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest
from redis.asyncio import Redis
from support.scripted_replica import ScriptedReplica, refusing_url

from loraplex.platform.gateway.errors import GatewayError
from loraplex.platform.gateway.replica_client import GenerateRequest, ReplicaClient
from loraplex.platform.gateway.replicas import ReplicaInfo, ReplicaRegistry
from loraplex.platform.gateway.router import (
    PrefixIndex,
    ReplicaLoad,
    ReplicaLost,
    Router,
    block_hashes,
    score,
)


def test_load_from_engine_state() -> None:
    load = ReplicaLoad.from_state(
        {
            "num_requests_running": 3,
            "num_requests_waiting": 2,
            "kv_cache_usage_perc": 0.25,
            "resident_adapters": ["aa", {"key": "bb"}],
            "max_loras": 4,
        }
    )
    assert (load.running, load.waiting, load.kv_usage) == (3, 2, 0.25)
    assert load.resident == {"aa", "bb"} and load.free_slots == 2


def test_score_orders_residency_prefix_queue_and_kv() -> None:
    idle = ReplicaLoad()
    resident = ReplicaLoad(resident={"k"}, free_slots=0)
    full = ReplicaLoad(resident={"x"}, free_slots=0)
    free = ReplicaLoad(free_slots=1)
    assert score(resident, "k", 0, 1) > score(free, "k", 0, 1) > score(full, "k", 0, 1)
    assert score(idle, None, 1.0, 1) > score(idle, None, 0.0, 1)
    busy = ReplicaLoad(running=8, waiting=8)
    assert score(idle, None, 0, 16) > score(busy, None, 0, 16)
    hot_kv = ReplicaLoad(kv_usage=0.95)
    assert score(idle, None, 0, 1) > score(hot_kv, None, 0, 1)
    # A long cached prefix outweighs a modest queue.
    assert score(ReplicaLoad(running=2), None, 1.0, 4) > score(ReplicaLoad(), None, 0.0, 4)


def test_prefix_hashes_are_salted_and_chained() -> None:
    ids = list(range(40))
    a = block_hashes(ids, 16, "adapter1|tenant1")
    assert len(a) == 2
    assert a != block_hashes(ids, 16, "adapter2|tenant1")
    assert a[0] == block_hashes(ids[:16] + [999] * 16, 16, "adapter1|tenant1")[0]
    idx = PrefixIndex()
    idx.record("r1", a[:1])
    assert idx.match("r1", a) == 0.5 and idx.match("r2", a) == 0.0


def _req(rid: str = "r") -> GenerateRequest:
    return GenerateRequest(rid, list(range(32)), {"max_tokens": 4}, None, "tenant:x")


async def _with_router(redis_url: str, replicas: list[tuple[str, str]], fn):
    redis = Redis.from_url(redis_url)
    http = httpx.AsyncClient()
    try:
        registry = ReplicaRegistry(redis, prefix=f"test:router:{uuid.uuid4().hex}")
        dep = "dep"
        for rid, url in replicas:
            await registry.register(ReplicaInfo(dep, url, replica_id=rid))
        return await fn(Router(registry, ReplicaClient(http)), dep)
    finally:
        await http.aclose()
        await redis.aclose()


def test_router_prefers_resident_adapter_and_prefix(redis_url: str) -> None:
    with (
        ScriptedReplica([1, 2], state={"resident_adapters": ["ad"], "max_loras": 1}) as hot,
        ScriptedReplica([1, 2], state={"num_requests_running": 1, "max_loras": 1}) as cold,
    ):

        async def body(router: Router, dep: str):
            first = await router.candidates(dep, "ad", [])
            tokens = [d.token_ids[0] async for d in router.generate(dep, _req(), "ad")]
            return first, tokens

        first, tokens = asyncio.run(
            _with_router(redis_url, [("hot", hot.url), ("cold", cold.url)], body)
        )
    assert [c.replica.replica_id for c in first] == ["hot", "cold"]
    assert tokens == [1, 2] and len(hot.requests) == 1 and not cold.requests


def test_failover_before_first_token(redis_url: str) -> None:
    dead_url, dead_sock = refusing_url()  # nothing listens: connection refused
    with (
        dead_sock,
        ScriptedReplica([7, 8, 9], fail="before", state={"resident_adapters": ["ad"]}) as broken,
        ScriptedReplica([4, 5, 6]) as good,
    ):
        seen: list[str] = []

        async def body(router: Router, dep: str):
            return [
                d.token_ids[0]
                async for d in router.generate(
                    dep, _req("req1"), "ad", lambda r, rid: seen.append(r.replica_id)
                )
            ]

        tokens = asyncio.run(
            _with_router(
                redis_url, [("dead", dead_url), ("broken", broken.url), ("good", good.url)], body
            )
        )
    assert tokens == [4, 5, 6]
    assert seen[-1] == "good" and "dead" not in seen  # the dead one failed /state: skipped
    assert broken.requests and good.requests[0]["request_id"].startswith("req1")


def test_replica_lost_after_first_token(redis_url: str) -> None:
    with ScriptedReplica([1, 2, 3, 4], fail="after") as flaky:
        got: list[int] = []

        async def body(router: Router, dep: str):
            with pytest.raises(ReplicaLost):
                async for d in router.generate(dep, _req(), None):
                    got.extend(d.token_ids)

        asyncio.run(_with_router(redis_url, [("flaky", flaky.url)], body))
    assert got == [1, 2]


def test_no_replica_is_503(redis_url: str) -> None:
    async def body(router: Router, dep: str):
        with pytest.raises(GatewayError) as info:
            async for _ in router.generate(dep, _req(), None):
                pass
        return info.value

    err = asyncio.run(_with_router(redis_url, [], body))
    assert err.status == 503 and err.code == "no_replica_available"
    dead_url, dead_sock = refusing_url()
    with dead_sock:
        err = asyncio.run(_with_router(redis_url, [("d1", dead_url)], body))
    assert err.status == 503 and int(err.headers["retry-after"]) >= 1
