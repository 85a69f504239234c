"""Cold starts at the router: with no live replica but one starting, a request waits up to
its deployment's bound for it (measured), then 503 `replicas_starting` with Retry-After; with
none starting it fails at once, as before. (A real replica that becomes ready late is driven
through the whole gateway in tests/api/test_gateway_lifecycle.py.)"""

from __future__ import annotations

import asyncio
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


def _metric(router: Router, name: str, **labels: str) -> float:
    value = router.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def _collect(router: Router, dep: str, wait_s: float) -> list:
    return [e async for e in router.generate(dep, _req(), None, cold_start_wait_s=wait_s)]


def test_waits_for_a_starting_replica_then_serves(redis_url: str) -> None:
    dep = f"cold-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        redis = Redis.from_url(redis_url)
        registry = ReplicaRegistry(redis)
        async with httpx.AsyncClient() as http:
            import os

            router = Router(registry, ReplicaClient(http, os.environ["LORAPLEX_REPLICA_SECRET"]))
            with ScriptedReplica([5, 6, 7]) as rep:
                info = ReplicaInfo(dep, rep.url)
                await registry.announce_starting(info, ttl_s=30)

                async def becomes_ready() -> None:
                    await asyncio.sleep(1.0)
                    await registry.register(info, ttl_s=30)  # what its heartbeat does once healthy

                began = time.monotonic()
                ready = asyncio.create_task(becomes_ready())
                events = await _collect(router, dep, wait_s=30)
                took = time.monotonic() - began
                await ready
            assert [e.token_ids for e in events[:-1]] == [[5], [6], [7]]
            assert 1.0 <= took < 5
            count = _metric(router, "loraplex:gateway_cold_start_wait_seconds_count",
                            deployment=dep, outcome="ready")  # fmt: skip
            waited = _metric(router, "loraplex:gateway_cold_start_wait_seconds_sum",
                             deployment=dep, outcome="ready")  # fmt: skip
            assert count == 1 and 1.0 <= waited <= took
            assert await registry.starting(dep) == 0  # live now: no longer counted as starting
        await redis.aclose()

    asyncio.run(main())


def test_the_wait_is_bounded_then_503_with_retry_after(redis_url: str) -> None:
    dep = f"cold-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        redis = Redis.from_url(redis_url)
        registry = ReplicaRegistry(redis)
        async with httpx.AsyncClient() as http:
            router = Router(registry, ReplicaClient(http, "x"))
            # Starting, never ready (a replica stuck loading weights).
            await registry.announce_starting(ReplicaInfo(dep, "http://127.0.0.1:9"), ttl_s=30)
            began = time.monotonic()
            with pytest.raises(HttpError) as caught:
                await _collect(router, dep, wait_s=0.8)
            took = time.monotonic() - began
            assert 0.8 <= took < 3
            err = caught.value
            assert err.status == 503 and err.code == "replicas_starting"
            assert int(err.headers["retry-after"]) > 0
            assert (
                _metric(router, "loraplex:gateway_cold_start_timeouts_total", deployment=dep) == 1
            )
            # Without a bound (or with nothing starting) it is the immediate 503 of before.
            began = time.monotonic()
            with pytest.raises(HttpError) as caught:
                await _collect(router, dep, wait_s=0)
            assert caught.value.code == "no_replica_available" and time.monotonic() - began < 1
            with pytest.raises(HttpError) as caught:
                await _collect(router, f"{dep}-none", wait_s=30)
            assert caught.value.code == "no_replica_available"
        await redis.aclose()

    asyncio.run(main())
