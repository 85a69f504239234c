"""Per-tenant rate limits in Redis: requests and tokens per minute, fixed one-minute windows.

One Lua script checks and charges both counters atomically (Redis' clock, so gateways agree).
A request is charged its prompt tokens plus its `max_tokens` up front, and the unused part
is given back when it finishes (`refund`). Results carry OpenAI's `x-ratelimit-*` headers;
a refusal is a 429 `GatewayError` with `Retry-After`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from redis.asyncio import Redis

from loraplex.platform.gateway.errors import GatewayError

WINDOW_MS = 60_000

_CHECK = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = math.floor(now_ms / tonumber(ARGV[4]))
local reset_ms = (window + 1) * tonumber(ARGV[4]) - now_ms
local rkey = KEYS[1] .. ':req:' .. window
local tkey = KEYS[1] .. ':tok:' .. window
local req = tonumber(redis.call('GET', rkey) or '0')
local tok = tonumber(redis.call('GET', tkey) or '0')
local rlim = tonumber(ARGV[1])
local tlim = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
if req + 1 > rlim or tok + want > tlim then
  return {0, req, tok, reset_ms, window}
end
req = redis.call('INCR', rkey)
tok = redis.call('INCRBY', tkey, want)
redis.call('PEXPIRE', rkey, tonumber(ARGV[4]) * 2)
redis.call('PEXPIRE', tkey, tonumber(ARGV[4]) * 2)
return {1, req, tok, reset_ms, window}
"""


def format_duration(ms: int) -> str:
    """OpenAI's reset format: `6m0s`, `12s`, `250ms`."""
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    seconds = ms / 1000
    minutes, rest = divmod(seconds, 60)
    rest_text = f"{rest:.0f}s" if rest == int(rest) else f"{rest:.1f}s".replace(".0s", "s")
    return f"{int(minutes)}m{rest_text}" if minutes else rest_text


@dataclass
class RateLimitResult:
    """The outcome of one check: whether it passed, the counters, and when they reset."""

    allowed: bool
    limit_requests: int
    limit_tokens: int
    used_requests: int
    used_tokens: int
    reset_ms: int
    window: int
    charged_tokens: int

    def headers(self) -> dict[str, str]:
        """The `x-ratelimit-*` headers (plus `retry-after` when refused)."""
        reset = format_duration(self.reset_ms)
        h = {
            "x-ratelimit-limit-requests": str(self.limit_requests),
            "x-ratelimit-limit-tokens": str(self.limit_tokens),
            "x-ratelimit-remaining-requests": str(max(self.limit_requests - self.used_requests, 0)),
            "x-ratelimit-remaining-tokens": str(max(self.limit_tokens - self.used_tokens, 0)),
            "x-ratelimit-reset-requests": reset,
            "x-ratelimit-reset-tokens": reset,
        }
        if not self.allowed:
            h["retry-after"] = str(max(1, math.ceil(self.reset_ms / 1000)))
            h["retry-after-ms"] = str(max(1, self.reset_ms))
        return h


class RateLimiter:
    """Checks and charges per-tenant request and token budgets in Redis."""

    def __init__(
        self, redis: Redis, prefix: str = "loraplex:rl", window_ms: int = WINDOW_MS
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._window_ms = window_ms
        self._script = redis.register_script(_CHECK)

    def _key(self, tenant_id: str) -> str:
        return f"{self._prefix}:{tenant_id}"

    async def check(self, tenant_id: str, tokens: int, rpm: int, tpm: int) -> RateLimitResult:
        """Charge one request and `tokens`; the result says whether it was allowed."""
        allowed, req, tok, reset_ms, window = await self._script(
            keys=[self._key(tenant_id)], args=[rpm, tpm, int(tokens), self._window_ms]
        )
        return RateLimitResult(
            bool(allowed), rpm, tpm, int(req), int(tok), int(reset_ms), int(window), int(tokens)
        )

    async def acquire(self, tenant_id: str, tokens: int, rpm: int, tpm: int) -> RateLimitResult:
        """Like `check`, but a refusal raises a 429 `GatewayError` carrying the headers."""
        result = await self.check(tenant_id, tokens, rpm, tpm)
        if result.allowed:
            return result
        if tokens > tpm:
            message = f"Request too large: it needs {tokens} tokens but the limit is {tpm} tokens per minute."
        else:
            message = (
                f"Rate limit reached: {rpm} requests and {tpm} tokens per minute. "
                f"Try again in {format_duration(result.reset_ms)}."
            )
        raise GatewayError(
            429,
            message,
            type="requests" if result.used_requests + 1 > rpm else "tokens",
            code="rate_limit_exceeded",
            headers=result.headers(),
        )

    async def refund(self, tenant_id: str, result: RateLimitResult, used_tokens: int) -> None:
        """Give back tokens charged up front but not used (only within the same window)."""
        unused = result.charged_tokens - max(used_tokens, 0)
        if unused <= 0:
            return
        key = f"{self._key(tenant_id)}:tok:{result.window}"
        if await self._redis.exists(key):
            await self._redis.decrby(key, unused)
