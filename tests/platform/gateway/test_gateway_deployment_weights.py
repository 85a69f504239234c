"""Operator weights across the deployments of one base model (issue 21, item 9): with no
weight set traffic follows capacity; with weights each deployment takes its share of the
requests; weight 0 is a standby that serves only while no weighted deployment has a live
replica. Resolution carries each deployment's weight and whether a request may name it, and
a named deployment is the only one routed to."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from redis.asyncio import Redis
from support.control_plane import fresh_database
from support.gateway_catalog import seed_catalog
from support.scripted_replica import ScriptedReplica

from loraplex.platform.db.models import Deployment
from loraplex.platform.db.session import make_sessionmaker
from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.deployment_choice import DeploymentRoute
from loraplex.platform.gateway.replica_client import ReplicaClient
from loraplex.platform.gateway.replicas import ReplicaInfo, ReplicaRegistry
from loraplex.platform.gateway.resolve import resolve_uncached, with_named_deployment
from loraplex.platform.gateway.router import Router
from loraplex.platform.services.tenants import create_tenant
from loraplex.platform.wire import GenerateRequest, SamplingOptions


def _req(rid: str) -> GenerateRequest:
    return GenerateRequest(request_id=rid, prompt_token_ids=list(range(16)),
                           sampling=SamplingOptions(max_tokens=1), cache_salt="salt")  # fmt: skip


def _route(name: str, weight: float | None) -> DeploymentRoute:
    return DeploymentRoute(name=name, id=uuid.uuid4(), weight=weight, nameable=False,
                           cold_start_wait_s=0.0)  # fmt: skip


def _served_by(redis_url: str, routes: list[DeploymentRoute], live: dict[str, str],
               requests: int, at_once: int = 1) -> Counter[str]:  # fmt: skip
    """Send `requests`, `at_once` at a time; count which deployment's replica took each."""

    async def body() -> Counter[str]:
        redis, http = Redis.from_url(redis_url), httpx.AsyncClient()
        prefix = f"test:weights:{uuid.uuid4().hex}"
        try:
            registry = ReplicaRegistry(redis, prefix=prefix)
            # States kept for the whole run: a replica slow to answer /state on a loaded
            # machine must not drop out of a draw.
            router = Router(registry, ReplicaClient(http, os.environ["LORAPLEX_REPLICA_SECRET"]),
                            rng=random.Random(7), state_ttl_s=600.0)  # fmt: skip
            for dep, url in live.items():
                await registry.register(ReplicaInfo(dep, url, replica_id=f"{dep}-r"))
            seen: Counter[str] = Counter()

            async def one(i: int) -> None:
                where: list = []
                async for _ in router.generate(routes[0].name, _req(f"r{i}"), None, where.append,
                                               routes=routes):  # fmt: skip
                    pass
                seen[where[-1].replica.deployment] += 1

            for start in range(0, requests, at_once):
                await asyncio.gather(*(one(i) for i in range(start, start + at_once)))
            return seen
        finally:
            await http.aclose()
            await redis.aclose()

    return asyncio.run(body())


def test_weights_split_the_traffic(redis_url: str) -> None:
    with ScriptedReplica([1]) as a, ScriptedReplica([2]) as b:
        seen = _served_by(redis_url, [_route("a", 3.0), _route("b", 1.0)],
                          {"a": a.url, "b": b.url}, 400)  # fmt: skip
    assert 0.66 <= seen["a"] / 400 <= 0.84, seen  # 3:1; binomial sd 0.022


def test_weight_zero_is_a_standby(redis_url: str) -> None:
    with ScriptedReplica([1]) as a, ScriptedReplica([2]) as b:
        routes = [_route("old", 0.0), _route("new", 1.0)]
        assert _served_by(redis_url, routes, {"old": a.url, "new": b.url}, 30) == {"new": 30}
        # The weighted one has no live replica: the standby serves rather than a 503.
        assert _served_by(redis_url, routes, {"old": a.url}, 5) == {"old": 5}


def test_without_weights_traffic_follows_capacity(redis_url: str) -> None:
    with ScriptedReplica([1], delay_s=0.05) as a, ScriptedReplica([2], delay_s=0.05) as b:
        seen = _served_by(redis_url, [_route("a", None), _route("b", None)],
                          {"a": a.url, "b": b.url}, 40, at_once=8)  # fmt: skip
    # A burst spreads over both deployments' replicas, as over one deployment's.
    assert 12 <= seen["a"] <= 28, seen


@pytest.fixture
def two_deployments(pg_url: str):
    factory = make_sessionmaker(fresh_database(pg_url))
    with factory() as s, s.begin():
        tenant = create_tenant(s, "acme")
        base, first = seed_catalog(s, "weighted-base")
        first.routing_weight = 0.0
        second = Deployment(
            id=uuid.uuid4(), name="weighted-base-bf16", base_model_id=base.id,
            weight_quantization="bf16", kv_cache_dtype="auto", max_loras=4, max_lora_rank=16,
            replicas=1, expert_parallel_size=1, routing_weight=2.5, nameable=True,
            cold_start_wait_s=7.0, created_at=datetime.now(UTC) + timedelta(seconds=1),
        )  # fmt: skip
        s.add(second)
        ids = tenant.id, first.name, second.name, second.id
    return factory, ids


def test_resolution_carries_weights_and_names(two_deployments) -> None:
    factory, (tenant_id, first, second, second_id) = two_deployments
    with factory() as s:
        resolved = resolve_uncached(s, tenant_id, "weighted-base")
    assert [(r.name, r.weight, r.nameable) for r in resolved.deployment_routes] == [
        (first, 0.0, False),
        (second, 2.5, True),
    ]
    named = with_named_deployment(resolved, second)
    assert named.deployment_name == second and named.deployment_id == second_id
    assert [r.name for r in named.deployment_routes] == [second]
    assert named.cold_start_wait_s == 7.0
    assert with_named_deployment(resolved, None) is resolved
    with pytest.raises(HttpError) as refused:
        with_named_deployment(resolved, first)
    assert refused.value.status == 403 and refused.value.code == "deployment_not_nameable"
    with pytest.raises(HttpError) as unknown:
        with_named_deployment(resolved, "someone-elses-deployment")
    assert unknown.value.status == 404 and unknown.value.code == "deployment_not_found"
