"""Per-tenant rate limits on a real Redis: headers, 429 with Retry-After, token refunds."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from redis.asyncio import Redis

from loraplex.platform.errors import HttpError
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
        with pytest.raises(HttpError) as info:
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
        with pytest.raises(HttpError) as info:
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
        with pytest.raises(HttpError) as info:
            await rl.acquire("t", 1, rpm=1, tpm=10)
        refused_at = time.monotonic()
        wait_s = int(info.value.headers["retry-after-ms"]) / 1000
        while True:  # retry until the window lets it through (a refusal charges nothing)
            result = await rl.check("t", 1, rpm=1, tpm=10)
            if result.allowed:
                break
            assert time.monotonic() - refused_at < 10, "the window never reset"
            await asyncio.sleep(0.01)
        assert time.monotonic() - refused_at >= wait_s - 0.05  # not before Retry-After said
        return result

    assert _run(redis_url, body).allowed


def test_monthly_quota_reserves_settles_and_refuses(redis_url: str) -> None:
    async def body(rl: RateLimiter, _):
        first = await rl.acquire("t", 600, rpm=100, tpm=10_000, quota=1000)
        with pytest.raises(HttpError) as short:  # 600 reserved: 600 more do not fit
            await rl.acquire("t", 600, rpm=100, tpm=10_000, quota=1000)
        await rl.refund("t", first, used_tokens=250)  # settled: 350 of 600 come back
        second = await rl.acquire("t", 600, rpm=100, tpm=10_000, quota=1000)
        await rl.refund("t", second, used_tokens=600)
        third = await rl.check("t", 1, rpm=100, tpm=10_000, quota=1000)
        with pytest.raises(HttpError) as spent:
            await rl.acquire("t", 200, rpm=100, tpm=10_000, quota=850)
        return first, short.value, second, third, spent.value

    first, short, second, third, spent = _run(redis_url, body)
    assert first.allowed and first.quota_used == 600
    assert short.status == 429 and short.code == "insufficient_quota"
    assert short.type == "insufficient_quota"
    assert "only 400 of your monthly quota of 1000 tokens remain" in short.message
    assert short.headers["x-should-retry"] == "false" and int(short.headers["retry-after"]) >= 1
    assert second.allowed and second.quota_used == 850  # 250 used + 600 reserved
    assert third.allowed and third.quota_used == 851  # a refused request charged nothing
    assert spent.code == "insufficient_quota" and "exceeded your monthly token quota" in (
        spent.message
    )


def test_quota_refusal_charges_no_request(redis_url: str) -> None:
    async def body(rl: RateLimiter, _):
        with pytest.raises(HttpError):
            await rl.acquire("t", 10, rpm=1, tpm=100, quota=5)
        return await rl.acquire("t", 10, rpm=1, tpm=100)  # the one request is still there

    assert _run(redis_url, body).used_requests == 1


def test_snapshot_reports_limits_and_remaining(redis_url: str) -> None:
    from loraplex.platform.gateway.ratelimit import TenantLimits

    async def body(rl: RateLimiter, _):
        await rl.acquire("t", 30, rpm=5, tpm=100, quota=1000)
        return await rl.snapshot("t", TenantLimits(5, 100, 1000))

    snap = _run(redis_url, body)
    assert snap["requests_per_minute"]["limit"] == 5
    assert snap["requests_per_minute"]["remaining"] == 4
    assert snap["tokens_per_minute"]["remaining"] == 70
    assert snap["monthly_tokens"]["quota"] == 1000
    assert snap["monthly_tokens"]["used"] == 30 and snap["monthly_tokens"]["remaining"] == 970
    assert snap["monthly_tokens"]["resets_at"].endswith("+00:00")


def test_next_month_start_rolls_the_year() -> None:
    from datetime import UTC, datetime

    from loraplex.platform.gateway.ratelimit import month_of, next_month_start

    assert next_month_start(datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == datetime(
        2027, 1, 1, tzinfo=UTC
    )
    assert next_month_start(datetime(2026, 2, 3, tzinfo=UTC)) == datetime(2026, 3, 1, tzinfo=UTC)
    assert month_of(datetime(2026, 7, 9, tzinfo=UTC)) == "2026-07"


def test_a_minutes_requests_cannot_be_spent_in_one_burst(redis_url: str) -> None:
    """Requests per minute are also enforced over `burst_ms` windows, scaled (as OpenAI
    enforces them over shorter periods): at 600 a minute, at most 100 in any 10 s, so a tenant
    cannot spend its minute in a one-second flood against its neighbours. Below the floor
    (`BURST_FLOOR` requests a window) a small limit keeps its whole burst."""
    from loraplex.platform.gateway.ratelimit import BURST_FLOOR

    async def body(_rl: RateLimiter, redis: Redis):
        rl = RateLimiter(redis, prefix=f"test:rl:{uuid.uuid4().hex}", burst_ms=10_000)
        admitted = 0
        refusal = None
        for _ in range(150):
            try:
                await rl.acquire("t", 0, rpm=600, tpm=10**9)
                admitted += 1
            except HttpError as exc:
                refusal = exc
        small = [
            (await rl.check("s", 0, rpm=BURST_FLOOR, tpm=10**9)).allowed
            for _ in range(BURST_FLOOR + 1)
        ]
        return admitted, refusal, small

    admitted, refusal, small = _run(redis_url, body)
    assert admitted in (100, 200)  # 100 a window (200 when the run crosses a boundary)
    assert refusal is not None and refusal.status == 429 and refusal.type == "requests"
    assert 1 <= int(refusal.headers["retry-after"]) <= 10  # the short window's end
    assert small == [True] * BURST_FLOOR + [False]


def test_the_limits_snapshot_names_the_short_window(redis_url: str) -> None:
    from loraplex.platform.gateway.ratelimit import TenantLimits

    async def body(_rl: RateLimiter, redis: Redis):
        rl = RateLimiter(redis, prefix=f"test:rl:{uuid.uuid4().hex}", burst_ms=10_000)
        big = await rl.snapshot("t", TenantLimits(600, 10**6, None))
        small = await rl.snapshot("t", TenantLimits(5, 10**6, None))
        return big["requests_per_minute"], small["requests_per_minute"]

    big, small = _run(redis_url, body)
    assert big["burst"] == {"limit": 100, "seconds": 10}
    assert "burst" not in small
