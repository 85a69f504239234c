"""Replica scoring and failover: adapter residency and cached prefix against queue depth and
KV use; a replica failing before the first token is retried elsewhere, after it the caller
gets `ReplicaLost`; no replica is a 503."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid

import httpx
import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from support.scripted_replica import ScriptedReplica, refusing_url, replica_state

from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.replica_client import ReplicaClient, ReplicaUnavailable
from loraplex.platform.gateway.replicas import ReplicaInfo, ReplicaRegistry
from loraplex.platform.gateway.router import (
    PrefixIndex,
    PromptKeys,
    ReplicaLoad,
    ReplicaLost,
    Router,
    score,
)
from loraplex.platform.wire import GenerateRequest, ReplicaState, SamplingOptions
from loraplex.platform.wire.prefix_hash import block_hashes


def test_load_from_engine_state() -> None:
    load = ReplicaLoad.from_state(
        replica_state(
            num_requests_running=3,
            num_requests_waiting=2,
            kv_cache_usage=0.25,
            resident_adapters=["aa", "bb"],
            max_loras=4,
            block_size=8,
        )
    )
    assert (load.running, load.waiting, load.kv_usage) == (3, 2, 0.25)
    assert load.resident == {"aa", "bb"} and load.free_slots == 2 and load.block_size == 8


def test_state_is_read_strictly() -> None:
    """One spelling per field: the old aliases and a KV use given as a percentage are refused."""
    good = replica_state().model_dump()
    for bad in (
        {**good, "kv_cache_usage": 25.0},
        {**good, "adapters": []},
        {**{k: v for k, v in good.items() if k != "resident_adapters"}, "loras": []},
        {**good, "num_requests_running": "3"},
        {**good, "wire_version": 2},
    ):
        with pytest.raises(ValidationError):
            ReplicaState.model_validate_json(json.dumps(bad))


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


def test_prefix_keys_are_the_engines_and_match_leading_blocks() -> None:
    ids = list(range(40))
    req = GenerateRequest(request_id="r", prompt_token_ids=ids, cache_salt="s1")
    load = ReplicaLoad(model_id="m", block_size=16)
    keys = PromptKeys(req, "adapter1").for_replica(load)
    assert keys == block_hashes(ids, 16, "m", "adapter1", "s1") and len(keys) == 2
    other = PromptKeys(req.model_copy(update={"cache_salt": "s2"}), "adapter1")
    assert other.for_replica(load)[0] != keys[0]
    idx = PrefixIndex()
    idx.record("r1", keys[:1])
    assert idx.leading("r1", keys) == 1 and idx.leading("r2", keys) == 0


def _req(rid: str = "r") -> GenerateRequest:
    return GenerateRequest(
        request_id=rid,
        prompt_token_ids=list(range(32)),
        sampling=SamplingOptions(max_tokens=4),
        cache_salt="salt",
    )


async def _with_router(redis_url: str, replicas: list[tuple[str, str]], fn):
    redis = Redis.from_url(redis_url)
    http = httpx.AsyncClient()
    try:
        registry = ReplicaRegistry(redis, prefix=f"test:router:{uuid.uuid4().hex}")
        dep = "dep"
        for rid, url in replicas:
            await registry.register(ReplicaInfo(dep, url, replica_id=rid))
        return await fn(
            Router(registry, ReplicaClient(http, os.environ["LORAPLEX_REPLICA_SECRET"])), dep
        )
    finally:
        await http.aclose()
        await redis.aclose()


def test_router_prefers_resident_adapter_and_prefix(redis_url: str) -> None:
    with (
        ScriptedReplica([1, 2], state=replica_state(resident_adapters=["ad"], max_loras=1)) as hot,
        ScriptedReplica([1, 2], state=replica_state(num_requests_running=1, max_loras=1)) as cold,
    ):

        async def body(router: Router, dep: str):
            first = await router.candidates(dep, "ad", PromptKeys(_req(), "ad"))
            tokens = [
                d.token_ids[0]
                async for d in router.generate(dep, _req(), "ad")
                if d.type == "delta"
            ]
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
        ScriptedReplica(
            [7, 8, 9], fail="before", state=replica_state(resident_adapters=["ad"])
        ) as broken,
        ScriptedReplica([4, 5, 6]) as good,
    ):
        seen: list[str] = []

        async def body(router: Router, dep: str):
            return [
                d.token_ids[0]
                async for d in router.generate(
                    dep, _req("req1"), "ad", lambda d: seen.append(d.replica.replica_id)
                )
                if d.type == "delta"
            ]

        tokens = asyncio.run(
            _with_router(
                redis_url, [("dead", dead_url), ("broken", broken.url), ("good", good.url)], body
            )
        )
    assert tokens == [4, 5, 6]
    assert seen[-1] == "good" and "dead" not in seen  # the dead one failed /state: skipped
    assert broken.requests and good.requests[0].request_id.startswith("req1")


def test_replica_lost_after_first_token(redis_url: str) -> None:
    with ScriptedReplica([1, 2, 3, 4], fail="after") as flaky:
        got: list[int] = []

        async def body(router: Router, dep: str):
            with pytest.raises(ReplicaLost):
                async for d in router.generate(dep, _req(), None):
                    got.extend(d.token_ids if d.type == "delta" else [])

        asyncio.run(_with_router(redis_url, [("flaky", flaky.url)], body))
    assert got == [1, 2]


def test_no_replica_is_503(redis_url: str) -> None:
    async def body(router: Router, dep: str):
        with pytest.raises(HttpError) as info:
            async for _ in router.generate(dep, _req(), None):
                pass
        return info.value

    err = asyncio.run(_with_router(redis_url, [], body))
    assert err.status == 503 and err.code == "no_replica_available"
    dead_url, dead_sock = refusing_url()
    with dead_sock:
        err = asyncio.run(_with_router(redis_url, [("d1", dead_url)], body))
    assert err.status == 503 and int(err.headers["retry-after"]) >= 1


def test_client_refuses_answers_outside_the_wire(redis_url: str) -> None:
    """A replica of another wire version, or one adding a field, is a failed replica (logged),
    never parsed around."""

    async def stream(url: str) -> list[object]:
        async with httpx.AsyncClient() as http:
            return [
                e
                async for e in ReplicaClient(http, os.environ["LORAPLEX_REPLICA_SECRET"]).generate(
                    url, _req()
                )
            ]

    async def state(url: str) -> object:
        async with httpx.AsyncClient() as http:
            return await ReplicaClient(http, os.environ["LORAPLEX_REPLICA_SECRET"]).state(url)

    with (
        ScriptedReplica([1, 2], version="2") as newer,
        ScriptedReplica([1, 2], extra_field=True) as chatty,
    ):
        for url in (newer.url, chatty.url):
            with pytest.raises(ReplicaUnavailable, match="protocol error"):
                asyncio.run(stream(url))
        with pytest.raises(ReplicaUnavailable, match="protocol error"):
            asyncio.run(state(newer.url))


def test_a_busy_replica_stays_a_candidate_on_its_last_state(redis_url: str) -> None:
    """Under load a replica answers /state late: the router routes on what it said last
    instead of dropping it (which turned load into 503s); a refusing replica is dropped."""
    dead_url, dead_sock = refusing_url()
    with dead_sock, ScriptedReplica([1], state=replica_state(num_requests_running=3)) as busy:

        async def body(router: Router, dep: str):
            router._state_ttl = 0.0  # read /state on every call
            first = await router.candidates(dep, None, PromptKeys(_req(), None))
            busy.state_delay_s = 1.5  # past the 1 s state timeout
            later = await router.candidates(dep, None, PromptKeys(_req(), None))
            return first, later

        first, later = asyncio.run(
            _with_router(redis_url, [("busy", busy.url), ("dead", dead_url)], body)
        )
    assert [c.replica.replica_id for c in first] == ["busy"]
    assert [c.replica.replica_id for c in later] == ["busy"]
    assert later[0].load.running == 3


def test_a_burst_reads_each_replicas_state_once(redis_url: str) -> None:
    """50 requests arriving together while nothing is cached share one /state call."""
    with ScriptedReplica([1]) as replica:

        async def body(router: Router, dep: str):
            replica.state_delay_s = 0.3
            return await asyncio.gather(
                *(router.candidates(dep, None, PromptKeys(_req(), None)) for _ in range(50))
            )

        results = asyncio.run(_with_router(redis_url, [("r", replica.url)], body))
    assert all([c.replica.replica_id for c in found] == ["r"] for found in results)
    assert replica.state_calls == 1


def test_a_stale_state_routes_at_once_and_is_refreshed_behind(redis_url: str) -> None:
    """Past its TTL, a replica's last state still routes the request at once (no wait on
    /state in its time to first token); one refresh runs behind it for the next request."""
    with ScriptedReplica([1], state=replica_state(num_requests_running=2)) as replica:

        async def body(router: Router, dep: str):
            router._state_ttl = 0.05
            await router.candidates(dep, None, PromptKeys(_req(), None))
            await asyncio.sleep(0.1)  # stale now
            replica.state_delay_s = 0.5
            replica.state_doc = replica_state(num_requests_running=7)
            began = time.monotonic()
            stale = await asyncio.gather(
                *(router.candidates(dep, None, PromptKeys(_req(), None)) for _ in range(10))
            )
            took = time.monotonic() - began
            await asyncio.sleep(0.8)  # the refresh lands
            fresh = await router.candidates(dep, None, PromptKeys(_req(), None))
            return stale, took, fresh

        stale, took, fresh = asyncio.run(_with_router(redis_url, [("r", replica.url)], body))
    assert took < 0.3, took
    assert all(found[0].load.running == 2 for found in stale)
    assert fresh[0].load.running == 7
    assert replica.state_calls == 2
