"""The replica registry on a real Redis: registration, heartbeats, expiry of stale replicas."""

from __future__ import annotations

import asyncio
import time
import uuid

from redis.asyncio import Redis

from loraplex.platform.gateway.replicas import Heartbeat, ReplicaInfo, ReplicaRegistry

# Long enough that a beat every 0.1 s cannot miss it on a loaded 2-core machine.
TTL_S = 2.0


def test_heartbeat_registers_and_expires(redis_url: str) -> None:
    prefix = f"test:reps:{uuid.uuid4().hex}"
    a = ReplicaInfo("dep", "http://127.0.0.1:1")
    b = ReplicaInfo("dep", "http://127.0.0.1:2")
    other = ReplicaInfo("dep2", "http://127.0.0.1:3")
    hb_a = Heartbeat(redis_url, a, ttl_s=TTL_S, interval_s=0.1, prefix=prefix).start()
    hb_b = Heartbeat(redis_url, b, ttl_s=TTL_S, interval_s=0.1, prefix=prefix).start()
    hb_o = Heartbeat(redis_url, other, ttl_s=TTL_S, interval_s=0.1, prefix=prefix).start()

    async def live() -> set[str]:
        redis = Redis.from_url(redis_url)
        try:
            return {r.url for r in await ReplicaRegistry(redis, prefix).live("dep")}
        finally:
            await redis.aclose()

    try:
        assert asyncio.run(live()) == {a.url, b.url}
        # Beats keep them alive well past the TTL: checked all along, not after a nap.
        until = time.monotonic() + 2 * TTL_S
        while time.monotonic() < until:
            assert asyncio.run(live()) == {a.url, b.url}
        hb_b.stop(deregister_now=False)  # a crash: no goodbye; it must expire by itself
        stopped = time.monotonic()
        assert b.url in asyncio.run(live())
        deadline = stopped + 10
        while asyncio.run(live()) != {a.url}:
            assert time.monotonic() < deadline, "the crashed replica never expired"
        assert time.monotonic() - stopped >= 0.3  # it expired by its TTL, not at once
        hb_a.stop()  # a clean shutdown leaves at once
        assert asyncio.run(live()) == set()
    finally:
        hb_a.stop()
        hb_o.stop()


def _live_urls(redis_url: str, prefix: str, deployment: str) -> set[str]:
    async def live() -> set[str]:
        redis = Redis.from_url(redis_url)
        try:
            return {r.url for r in await ReplicaRegistry(redis, prefix).live(deployment)}
        finally:
            await redis.aclose()

    return asyncio.run(live())


def test_a_busy_replica_keeps_its_registration_for_a_grace_then_loses_it(redis_url: str) -> None:
    """A health check that times out (None: busy) keeps a ready replica registered for
    `busy_grace_s`; one that refuses (False) stops the beats at once."""
    prefix = f"test:reps:{uuid.uuid4().hex}"
    answers = {"busy": True, "grace": True, "dead": True}

    def probe(name: str):
        def check() -> bool | None:
            return answers[name]

        return check

    beats = {
        name: Heartbeat(
            redis_url, ReplicaInfo(name, f"http://127.0.0.1:{i + 1}"), ttl_s=TTL_S,
            interval_s=0.1, prefix=prefix, healthy=probe(name), busy_grace_s=grace,
        ).start()
        for i, (name, grace) in enumerate([("busy", 60.0), ("grace", 1.0), ("dead", 60.0)])
    }  # fmt: skip
    try:
        assert all(_live_urls(redis_url, prefix, n) for n in answers)
        answers.update(busy=None, grace=None, dead=False)
        until = time.monotonic() + 2 * TTL_S + 1.5
        while time.monotonic() < until:
            assert _live_urls(redis_url, prefix, "busy"), "a busy replica lost its registration"
        assert not _live_urls(redis_url, prefix, "grace"), "busy past its grace, still live"
        assert not _live_urls(redis_url, prefix, "dead"), "a refusing replica is still live"
    finally:
        for hb in beats.values():
            hb.stop()


def test_listing_live_replicas_is_one_round_trip(redis_url: str) -> None:
    """Every request lists the live replicas: one call to Redis (it was three), which prunes
    the expired ids and skips ids whose record is gone."""
    prefix = f"test:reps:{uuid.uuid4().hex}"

    async def body() -> tuple[set[str], int, list[bytes]]:
        redis = Redis.from_url(redis_url)
        try:
            registry = ReplicaRegistry(redis, prefix)
            for port in (1, 2, 3):
                info = ReplicaInfo("dep", f"http://127.0.0.1:{port}", replica_id=f"r{port}")
                await registry.register(info, ttl_s=60)
            await redis.zadd(f"{prefix}:dep:dep", {"r2": 1})  # expired long ago
            await redis.delete(f"{prefix}:rep:r3")  # its record gone before its id
            await registry.live("dep")  # loads the script
            calls = 0
            sent = redis.execute_command

            async def counted(*args: object, **kwargs: object) -> object:
                nonlocal calls
                calls += 1
                return await sent(*args, **kwargs)

            redis.execute_command = counted  # type: ignore[method-assign]
            found = {r.url for r in await registry.live("dep")}
            redis.execute_command = sent  # type: ignore[method-assign]
            return found, calls, await redis.zrange(f"{prefix}:dep:dep", 0, -1)
        finally:
            await redis.aclose()

    found, calls, ids = asyncio.run(body())
    assert found == {"http://127.0.0.1:1"}
    assert calls == 1
    assert sorted(ids) == [b"r1", b"r3"]  # the expired id pruned
