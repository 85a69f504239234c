"""A base model is served by every deployment of it: resolution names them all (oldest
first) and publishes the group beside the replica registry; the router takes the live (or,
in a cold start, the starting) replicas of the whole group, so an oldest deployment scaled
to zero no longer answers 503 while a newer one has replicas, and traffic follows capacity.
A switch from one deployment to another under steady load fails no request."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
from redis.asyncio import Redis
from support.control_plane import fresh_database
from support.gateway_catalog import seed_catalog
from support.scripted_replica import ScriptedReplica

from loraplex.platform.db.models import Deployment
from loraplex.platform.db.session import make_sessionmaker
from loraplex.platform.gateway.replica_client import ReplicaClient
from loraplex.platform.gateway.replicas import ReplicaInfo, ReplicaRegistry
from loraplex.platform.gateway.resolve import (
    ModelResolver,
    group_key,
    publish_group,
    resolve_uncached,
)
from loraplex.platform.gateway.router import Router
from loraplex.platform.services.tenants import create_tenant
from loraplex.platform.wire import GenerateRequest, SamplingOptions


def _req(rid: str) -> GenerateRequest:
    return GenerateRequest(request_id=rid, prompt_token_ids=list(range(16)),
                           sampling=SamplingOptions(max_tokens=3), cache_salt="salt")  # fmt: skip


def test_resolution_names_every_deployment_of_the_base(pg_url: str, redis_url: str) -> None:
    factory = make_sessionmaker(fresh_database(pg_url))
    with factory() as s, s.begin():
        tenant = create_tenant(s, "acme")
        base, first = seed_catalog(s, "grouped-base")
        second = Deployment(
            id=uuid.uuid4(), name="grouped-base-int4", base_model_id=base.id,
            weight_quantization="int4", kv_cache_dtype="auto", max_loras=4, max_lora_rank=16,
            replicas=1, expert_parallel_size=1,
            created_at=datetime.now(UTC) + timedelta(seconds=1),
        )  # fmt: skip
        s.add(second)
        tenant_id, names = tenant.id, (first.name, second.name)
    with factory() as s:
        resolved = resolve_uncached(s, tenant_id, "grouped-base")
    assert resolved.deployment_name == names[0]  # usage and metrics keep the oldest's name
    assert resolved.deployment_names == names

    async def published() -> list[str]:
        redis = Redis.from_url(redis_url)
        prefix = f"test:group:{uuid.uuid4().hex}"
        try:
            await ModelResolver(redis, group_prefix=prefix).resolve(factory, tenant_id,
                                                                    "grouped-base")  # fmt: skip
            return json.loads(await redis.get(group_key(prefix, names[0])))
        finally:
            await redis.aclose()

    assert asyncio.run(published()) == list(names)


async def _router(redis: Redis, prefix: str, http: httpx.AsyncClient) -> Router:
    registry = ReplicaRegistry(redis, prefix=prefix)
    return Router(registry, ReplicaClient(http, os.environ["LORAPLEX_REPLICA_SECRET"]))


def test_the_newer_deployment_serves_when_the_oldest_is_at_zero(redis_url: str) -> None:
    with ScriptedReplica([7, 8, 9]) as newer:

        async def body() -> list[int]:
            redis, http = Redis.from_url(redis_url), httpx.AsyncClient()
            prefix = f"test:group:{uuid.uuid4().hex}"
            try:
                router = await _router(redis, prefix, http)
                await publish_group(redis, ["old-fp32", "new-bf16"], prefix=prefix)
                await router.registry.register(ReplicaInfo("new-bf16", newer.url, replica_id="n1"))
                return [d.token_ids[0] async for d in router.generate("old-fp32", _req("r1"), None)
                        if d.type == "delta"]  # fmt: skip
            finally:
                await http.aclose()
                await redis.aclose()

        assert asyncio.run(body()) == [7, 8, 9]
        assert len(newer.requests) == 1


def test_a_switch_under_steady_load_fails_no_request(redis_url: str) -> None:
    """Two replicas of `old` serve a steady load; two of `new` start and become ready; then
    `old` deregisters (what its replicas do on SIGTERM before draining). No request fails,
    and new requests go to `new` once `old` is gone."""
    with (
        ScriptedReplica([1, 2, 3], delay_s=0.01) as o1,
        ScriptedReplica([1, 2, 3], delay_s=0.01) as o2,
        ScriptedReplica([4, 5, 6], delay_s=0.01) as n1,
        ScriptedReplica([4, 5, 6], delay_s=0.01) as n2,
    ):

        async def body() -> tuple[int, int, int]:
            redis, http = Redis.from_url(redis_url), httpx.AsyncClient()
            prefix = f"test:group:{uuid.uuid4().hex}"
            ok = failed = 0
            stop = asyncio.Event()
            try:
                router = await _router(redis, prefix, http)
                reg = router.registry
                await publish_group(redis, ["old", "new"], prefix=prefix)
                olds = [
                    ReplicaInfo("old", r.url, replica_id=f"o{i}") for i, r in enumerate((o1, o2))
                ]
                news = [
                    ReplicaInfo("new", r.url, replica_id=f"n{i}") for i, r in enumerate((n1, n2))
                ]
                for info in olds:
                    await reg.register(info)

                async def client(k: int) -> None:
                    nonlocal ok, failed
                    i = 0
                    while not stop.is_set():
                        i += 1
                        try:
                            events = [e async for e in router.generate(
                                "old", _req(f"c{k}-{i}"), None, cold_start_wait_s=5.0)]  # fmt: skip
                            ok += events[-1].type == "finish"
                        except Exception:  # noqa: BLE001 - every failure is counted
                            failed += 1

                clients = [asyncio.create_task(client(k)) for k in range(4)]
                await asyncio.sleep(0.6)
                for info in news:
                    await reg.announce_starting(info)
                await asyncio.sleep(0.4)
                for info in news:
                    await reg.register(info)
                await asyncio.sleep(0.5)
                for info in olds:
                    await reg.remove(info)
                gone_at = (len(o1.requests), len(o2.requests), time.monotonic())
                await asyncio.sleep(1.0)
                stop.set()
                await asyncio.gather(*clients)
                late = len(o1.requests) + len(o2.requests) - gone_at[0] - gone_at[1]
                return ok, failed, late
            finally:
                await http.aclose()
                await redis.aclose()

        ok, failed, late = asyncio.run(body())
    assert failed == 0, (ok, failed)
    assert ok > 40
    assert n1.requests and n2.requests  # traffic spread over the new replicas
    assert late <= 4  # at most the requests already on their way when `old` left
