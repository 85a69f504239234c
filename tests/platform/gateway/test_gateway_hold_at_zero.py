"""Scale from zero at the router: with `hold_at_zero` (the gateway's setting where KEDA scales
deployments from zero), a request for a deployment with no replica live or starting is held
up to its bound and counted in `loraplex:gateway_requests_waiting` (what KEDA's activation
trigger reads) until a replica registers; without it, it fails at once as before."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import httpx
import pytest
from redis.asyncio import Redis
from support.scripted_replica import ScriptedReplica

from loraplex.platform.errors import HttpError
from loraplex.platform.gateway.replica_client import ReplicaClient
from loraplex.platform.gateway.replicas import ReplicaInfo, ReplicaRegistry
from loraplex.platform.gateway.router import Router
from loraplex.platform.wire import GenerateRequest


def _req() -> GenerateRequest:
    return GenerateRequest(request_id=uuid.uuid4().hex, prompt_token_ids=[1, 2, 3])


def _waiting(router: Router, dep: str) -> float:
    value = router.metrics.registry.get_sample_value(
        "loraplex:gateway_requests_waiting", {"deployment": dep}
    )
    return 0.0 if value is None else value


async def _collect(router: Router, dep: str, wait_s: float) -> list:
    return [e async for e in router.generate(dep, _req(), None, cold_start_wait_s=wait_s)]


def test_a_request_for_a_deployment_at_zero_is_held_until_a_replica_comes(redis_url: str) -> None:
    dep = f"zero-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        redis = Redis.from_url(redis_url)
        registry = ReplicaRegistry(redis)
        async with httpx.AsyncClient() as http:
            client = ReplicaClient(http, os.environ["LORAPLEX_REPLICA_SECRET"])
            router = Router(registry, client, hold_at_zero=True)
            with ScriptedReplica([5, 6]) as rep:
                seen: list[float] = []

                async def keda_wakes_it() -> None:
                    await asyncio.sleep(0.5)
                    seen.append(_waiting(router, dep))  # the activation trigger's value
                    info = ReplicaInfo(dep, rep.url)
                    await registry.announce_starting(info, ttl_s=30)
                    await asyncio.sleep(0.5)
                    await registry.register(info, ttl_s=30)

                began = time.monotonic()
                wake = asyncio.create_task(keda_wakes_it())
                events = await _collect(router, dep, wait_s=30)
                took = time.monotonic() - began
                await wake
            assert [e.token_ids for e in events[:-1]] == [[5], [6]]
            assert seen == [1.0]
            assert 1.0 <= took < 5
            assert _waiting(router, dep) == 0
        await redis.aclose()

    asyncio.run(main())


def test_the_hold_is_bounded_and_off_by_default(redis_url: str) -> None:
    dep = f"zero-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        redis = Redis.from_url(redis_url)
        registry = ReplicaRegistry(redis)
        async with httpx.AsyncClient() as http:
            router = Router(registry, ReplicaClient(http, "x"), hold_at_zero=True)
            began = time.monotonic()
            with pytest.raises(HttpError) as caught:
                await _collect(router, dep, wait_s=0.8)
            assert 0.8 <= time.monotonic() - began < 3
            assert caught.value.status == 503 and caught.value.code == "replicas_starting"
            assert _waiting(router, dep) == 0
            # Off (the default: no one would scale it from zero): 503 at once, nothing counted.
            plain = Router(registry, ReplicaClient(http, "x"))
            began = time.monotonic()
            with pytest.raises(HttpError) as caught:
                await _collect(plain, dep, wait_s=30)
            assert caught.value.code == "no_replica_available"
            assert time.monotonic() - began < 1
        await redis.aclose()

    asyncio.run(main())


def test_the_setting_reaches_the_gateways_router(redis_url: str) -> None:
    """`LORAPLEX_GATEWAY_HOLD_AT_ZERO` (set by infra/k8s where KEDA scales from zero)."""
    from loraplex.platform.gateway.service import Gateway
    from loraplex.platform.settings import Settings

    redis = Redis.from_url(redis_url)
    for on in (True, False):
        settings = Settings(gateway_hold_at_zero=on, replica_secret="s")
        gateway = Gateway(settings, redis, session_factory=None)  # type: ignore[arg-type]
        assert gateway.router.hold_at_zero is on
        asyncio.run(gateway.http.aclose())
