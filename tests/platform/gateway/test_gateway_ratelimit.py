"""Per-tenant rate limits on a real Redis: headers, 429 with Retry-After, token refunds."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from loraplex.platform.gateway.errors import GatewayError
from loraplex.platform.gateway.ratelimit import RateLimiter, format_duration


def test_format_duration() -> None:
    assert format_duration(250) == "250ms"
    assert format_duration(12_000) == "12s"
    assert format_duration(360_000) == "6m0s"
    assert format_duration(61_500) == "1m1.5s"


def _run(redis_url: str, coro_fn):
    async def main():
        redis = Redis.from_url(redis_url)
        try:
            return await coro_fn(RateLimiter(redis, prefix=f"test:rl:{uuid.uuid4().hex}"), redis)
        finally:
            await redis.aclose()

    return asyncio.run(main())


def test_requests_limit_headers_and_429(redis_url: str) -> None:
    async def body(rl: RateLimiter, _):
        results = [await rl.acquire("t1", 10, rpm=3, tpm=1000) for _ in range(3)]
        with pytest.raises(GatewayError) as info:
            await rl.acquire("t1", 10, rpm=3, tpm=1000)
        other = await rl.acquire("t2", 10, rpm=3, tpm=1000)  # tenants are separate
        return results, info.value, other

    results, err, other = _run(redis_url, body)
    h = results[0].headers()
    assert h["x-ratelimit-limit-requests"] == "3" and h["x-ratelimit-limit-tokens"] == "1000"
    assert h["x-ratelimit-remaining-requests"] == "2" and h["x-ratelimit-remaining-tokens"] == "990"
    assert results[2].headers()["x-ratelimit-remaining-requests"] == "0"
    assert h["x-ratelimit-reset-requests"].endswith("s")
    assert err.status == 429 and err.code == "rate_limit_exceeded" and err.type == "requests"
    retry = int(err.headers["retry-after"])
    assert 1 <= retry <= 60
    assert err.headers["x-ratelimit-remaining-requests"] == "0"
    assert other.allowed


def test_tokens_limit_and_refund(redis_url: str) -> None:
    async def body(rl: RateLimiter, _):
        first = await rl.acquire("t", 600, rpm=100, tpm=1000)
        with pytest.raises(GatewayError) as info:
            await rl.acquire("t", 600, rpm=100, tpm=1000)
        await rl.refund("t", first, used_tokens=100)  # 500 of the 600 charged come back
        second = await rl.acquire("t", 600, rpm=100, tpm=1000)
        return info.value, second

    err, second = _run(redis_url, body)
    assert err.status == 429 and err.type == "tokens"
    assert second.allowed and second.headers()["x-ratelimit-remaining-tokens"] == "300"


def test_window_resets(redis_url: str) -> None:
    async def body(_rl: RateLimiter, redis: Redis):
        rl = RateLimiter(redis, prefix=f"test:rl:{uuid.uuid4().hex}", window_ms=400)
        await rl.acquire("t", 1, rpm=1, tpm=10)
        with pytest.raises(GatewayError) as info:
            await rl.acquire("t", 1, rpm=1, tpm=10)
        await asyncio.sleep(int(info.value.headers["retry-after-ms"]) / 1000 + 0.05)
        return await rl.acquire("t", 1, rpm=1, tpm=10)

    assert _run(redis_url, body).allowed
