"""Per-tenant rate limits and monthly token quotas in Redis.

Requests and tokens per minute use fixed one-minute windows; requests are also held to their
share of the minute over shorter windows (`burst_ms`; at least `BURST_FLOOR` a window), as
OpenAI enforces its limits over shorter periods, so a tenant cannot spend a minute's requests
in one flood against its neighbours. The quota counts a tenant's
tokens per calendar month (UTC). One Lua script checks and charges all three atomically
(Redis' clock for the windows, so gateways agree). A request is admitted in two steps, so
limits are checked before any work is done for it: `admit` right after authentication
charges the request (and refuses a tenant whose tokens or quota are spent), then
`acquire_tokens` charges its prompt tokens plus its `max_tokens` once the prompt is counted;
the unused part is given back when it finishes (`refund`). `acquire` does both at once. Results carry OpenAI's `x-ratelimit-*` headers; a refusal is a 429
`HttpError`: `rate_limit_exceeded` with `Retry-After`, or `insufficient_quota`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from redis.asyncio import Redis

from loraplex.platform.errors import HttpError
from loraplex.platform.settings import Settings

WINDOW_MS = 60_000
UNBOUNDED = 2**62  # a limit that never binds
BURST_FLOOR = 10  # requests a short window always allows (a small limit keeps its burst)
QUOTA_TTL_MS = 40 * 24 * 3600 * 1000  # a month's counter outlives its month, then goes

# KEYS: window prefix, this month's quota counter.
# ARGV: rpm, tpm, tokens wanted, window ms, quota (-1: none), quota counter TTL ms,
# count the request (1) or only charge tokens (0), short window ms (0: none), requests a short
# window allows.
# Returns {status, requests, tokens, reset_ms, window, quota_used}; status 1 allowed,
# 0 over a per-minute limit, 2 over the short window's share of the requests (reset_ms: its
# end), -1 over the monthly quota (nothing is charged unless 1).
# Admitting a request with no tokens yet needs one token left in the window and the quota.
_CHECK = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = math.floor(now_ms / tonumber(ARGV[4]))
local reset_ms = (window + 1) * tonumber(ARGV[4]) - now_ms
local rkey = KEYS[1] .. ':req:' .. window
local tkey = KEYS[1] .. ':tok:' .. window
local req = tonumber(redis.call('GET', rkey) or '0')
local tok = tonumber(redis.call('GET', tkey) or '0')
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
local rlim = tonumber(ARGV[1])
local tlim = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local quota = tonumber(ARGV[5])
local count_req = tonumber(ARGV[7]) == 1
local need = want
if count_req and need == 0 then need = 1 end
if quota >= 0 and used + need > quota then
  return {-1, req, tok, reset_ms, window, used}
end
if (count_req and req + 1 > rlim) or tok + need > tlim then
  return {0, req, tok, reset_ms, window, used}
end
local bms = tonumber(ARGV[8])
local bkey = nil
if count_req and bms > 0 then
  local bwin = math.floor(now_ms / bms)
  bkey = KEYS[1] .. ':burst:' .. bwin
  if tonumber(redis.call('GET', bkey) or '0') + 1 > tonumber(ARGV[9]) then
    return {2, req, tok, (bwin + 1) * bms - now_ms, window, used}
  end
end
if count_req then
  req = redis.call('INCR', rkey)
  redis.call('PEXPIRE', rkey, tonumber(ARGV[4]) * 2)
  if bkey then
    redis.call('INCR', bkey)
    redis.call('PEXPIRE', bkey, bms * 2)
  end
end
if want > 0 then
  tok = redis.call('INCRBY', tkey, want)
  used = redis.call('INCRBY', KEYS[2], want)
  redis.call('PEXPIRE', tkey, tonumber(ARGV[4]) * 2)
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[6]))
end
return {1, req, tok, reset_ms, window, used}
"""

# Give back unused tokens to counters that still exist (a past window has expired).
_REFUND = """
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then redis.call('DECRBY', key, ARGV[1]) end
end
return 1
"""


@dataclass(frozen=True)
class TenantLimits:
    """A tenant's effective limits: its own where set, else the deployment's defaults."""

    requests_per_minute: int
    tokens_per_minute: int
    monthly_token_quota: int | None  # None: no quota


class HasLimits(Protocol):
    """A tenant row, or anything carrying its three limit columns (read-only)."""

    @property
    def requests_per_minute(self) -> int | None: ...
    @property
    def tokens_per_minute(self) -> int | None: ...
    @property
    def monthly_token_quota(self) -> int | None: ...


def tenant_limits(tenant: HasLimits, settings: Settings) -> TenantLimits:
    """The limits that apply to `tenant` (NULL columns fall back to `settings`)."""

    def pick(own: int | None, default: int | None) -> int | None:
        return own if own is not None else default

    return TenantLimits(
        requests_per_minute=pick(tenant.requests_per_minute, settings.rate_limit_rpm) or 0,
        tokens_per_minute=pick(tenant.tokens_per_minute, settings.rate_limit_tpm) or 0,
        monthly_token_quota=pick(tenant.monthly_token_quota, settings.monthly_token_quota),
    )


def month_of(now: datetime) -> str:
    """The quota period a moment falls in: `YYYY-MM` (UTC)."""
    return now.astimezone(UTC).strftime("%Y-%m")


def next_month_start(now: datetime) -> datetime:
    """When the quota period holding `now` ends (the 1st of next month, 00:00 UTC)."""
    now = now.astimezone(UTC)
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


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
    quota: int | None = None
    quota_used: int = 0
    quota_key: str | None = None
    over_quota: bool = False
    over_burst: int = 0  # refused over a short window's share: the requests it allows

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
    """Checks and charges per-tenant request, token and quota budgets in Redis."""

    def __init__(
        self,
        redis: Redis,
        prefix: str = "loraplex:rl",
        window_ms: int = WINDOW_MS,
        burst_ms: int = 0,
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._window_ms = window_ms
        self._burst_ms = burst_ms if 0 < burst_ms < window_ms else 0
        self._script = redis.register_script(_CHECK)
        self._refund = redis.register_script(_REFUND)

    def _key(self, tenant_id: str) -> str:
        return f"{self._prefix}:{tenant_id}"

    def _quota_key(self, tenant_id: str, now: datetime) -> str:
        return f"{self._prefix}:{tenant_id}:quota:{month_of(now)}"

    async def check(
        self,
        tenant_id: str,
        tokens: int,
        rpm: int,
        tpm: int,
        quota: int | None = None,
        *,
        count_request: bool = True,
    ) -> RateLimitResult:
        """Charge one request (unless `count_request` is False) and `tokens`; the result says
        whether it was allowed.

        Tokens count against this month's quota even with no quota set, so the usage is
        known (and a quota set mid-month applies to it)."""
        qkey = self._quota_key(tenant_id, datetime.now(UTC))
        quota_arg = -1 if quota is None else quota
        burst = self.burst_requests(rpm)
        status, req, tok, reset_ms, window, used = await self._script(
            keys=[self._key(tenant_id), qkey],
            args=[
                rpm,
                tpm,
                int(tokens),
                self._window_ms,
                quota_arg,
                QUOTA_TTL_MS,
                1 if count_request else 0,
                self._burst_ms if burst < rpm else 0,
                burst,
            ],
        )
        status = int(status)
        return RateLimitResult(
            status == 1,
            rpm,
            tpm,
            int(req),
            int(tok),
            int(reset_ms),
            int(window),
            int(tokens),
            quota=quota,
            quota_used=int(used),
            quota_key=qkey,
            over_quota=status == -1,
            over_burst=burst if status == 2 else 0,
        )

    def burst_requests(self, rpm: int) -> int:
        """The requests any short window allows: the window's share of `rpm`, at least
        `BURST_FLOOR` (`rpm` itself when there are no short windows)."""
        if not self._burst_ms:
            return rpm
        return max(math.ceil(rpm * self._burst_ms / self._window_ms), BURST_FLOOR)

    async def admit(self, tenant_id: str, limits: TenantLimits) -> RateLimitResult:
        """Charge one request before any work is done for it (429 when over its requests per
        minute, or when no token is left this minute or this month)."""
        return await self.acquire(
            tenant_id,
            0,
            limits.requests_per_minute,
            limits.tokens_per_minute,
            limits.monthly_token_quota,
        )

    async def acquire_tokens(
        self, tenant_id: str, tokens: int, limits: TenantLimits
    ) -> RateLimitResult:
        """Charge the tokens of a request `admit` let in (429 when they do not fit)."""
        return await self.acquire(
            tenant_id,
            tokens,
            limits.requests_per_minute,
            limits.tokens_per_minute,
            limits.monthly_token_quota,
            count_request=False,
        )

    async def acquire(
        self,
        tenant_id: str,
        tokens: int,
        rpm: int,
        tpm: int,
        quota: int | None = None,
        *,
        count_request: bool = True,
    ) -> RateLimitResult:
        """Like `check`, but a refusal raises a 429 `HttpError` carrying the headers."""
        result = await self.check(tenant_id, tokens, rpm, tpm, quota, count_request=count_request)
        if result.allowed:
            return result
        if result.over_quota:
            raise quota_error(result, tokens, datetime.now(UTC))
        if result.over_burst:
            message = self._requests_message(rpm, result)
        elif tokens > tpm:
            message = f"Request too large: it needs {tokens} tokens but the limit is {tpm} tokens per minute."
        else:
            message = (
                f"Rate limit reached: {rpm} requests and {tpm} tokens per minute. "
                f"Try again in {format_duration(result.reset_ms)}."
            )
        raise HttpError(
            429,
            message,
            type="requests"
            if result.over_burst or (count_request and result.used_requests + 1 > rpm)
            else "tokens",
            code="rate_limit_exceeded",
            headers=result.headers(),
        )

    async def admit_request(self, tenant_id: str, rpm: int) -> RateLimitResult:
        """Charge one request against `rpm` alone (a budget without tokens or quota: the
        adapter API's); a refusal raises a 429 `HttpError` with the request headers."""
        result = await self.check(tenant_id, 0, rpm, UNBOUNDED)
        if result.allowed:
            return result
        raise HttpError(
            429,
            self._requests_message(rpm, result),
            type="requests",
            code="rate_limit_exceeded",
            headers={k: v for k, v in result.headers().items() if "-tokens" not in k},
        )

    def _requests_message(self, rpm: int, result: RateLimitResult) -> str:
        """A refusal over the requests per minute, or over their short window's share."""
        burst = (
            f", at most {result.over_burst} in any {self._burst_ms / 1000:g} seconds"
            if result.over_burst
            else ""
        )
        return (
            f"Rate limit reached: {rpm} requests per minute{burst}. "
            f"Try again in {format_duration(result.reset_ms)}."
        )

    async def charge(self, tenant_id: str, tokens: int) -> None:
        """Count `tokens` used after the request was settled (this minute's window and the
        month's quota), whatever the limits: the work was done."""
        await self.check(tenant_id, tokens, UNBOUNDED, UNBOUNDED, None, count_request=False)

    async def refund(self, tenant_id: str, result: RateLimitResult, used_tokens: int) -> None:
        """Settle a request: give back the tokens charged up front but not used (to this
        minute's window while it lasts, and to the month's quota counter)."""
        unused = result.charged_tokens - max(used_tokens, 0)
        if unused <= 0:
            return
        keys = [f"{self._key(tenant_id)}:tok:{result.window}"]
        if result.quota_key is not None:
            keys.append(result.quota_key)
        await self._refund(keys=keys, args=[unused])

    async def snapshot(self, tenant_id: str, limits: TenantLimits) -> dict[str, Any]:
        """What the tenant may still use: this minute's requests and tokens, this month's
        quota (read only; nothing is charged)."""
        seconds, micros = await self._redis.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        window = now_ms // self._window_ms
        reset = format_duration((window + 1) * self._window_ms - now_ms)
        now = datetime.now(UTC)
        base = self._key(tenant_id)
        req, tok, used = await self._redis.mget(
            f"{base}:req:{window}", f"{base}:tok:{window}", self._quota_key(tenant_id, now)
        )
        rpm, tpm, quota = (
            limits.requests_per_minute,
            limits.tokens_per_minute,
            limits.monthly_token_quota,
        )
        used_tokens = int(used or 0)
        return {
            "object": "limits",
            "requests_per_minute": {
                "limit": rpm,
                "remaining": max(rpm - int(req or 0), 0),
                "reset": reset,
                # at most this many in any `seconds` (absent: the minute's limit only)
                **(
                    {"burst": {"limit": burst, "seconds": self._burst_ms // 1000}}
                    if (burst := self.burst_requests(rpm)) < rpm
                    else {}
                ),
            },
            "tokens_per_minute": {
                "limit": tpm,
                "remaining": max(tpm - int(tok or 0), 0),
                "reset": reset,
            },
            "monthly_tokens": {
                "quota": quota,
                "used": used_tokens,
                "remaining": None if quota is None else max(quota - used_tokens, 0),
                "resets_at": next_month_start(now).isoformat(),
            },
        }


def quota_error(result: RateLimitResult, tokens: int, now: datetime) -> HttpError:
    """The 429 `insufficient_quota` for a request the monthly quota cannot cover; OpenAI's
    SDK is told not to retry (`x-should-retry: false`): waiting a minute will not help."""
    quota = result.quota or 0
    remaining = max(quota - result.quota_used, 0)
    resets = next_month_start(now)
    when = f"{resets:%Y-%m-%d} 00:00 UTC"
    if remaining == 0:
        message = (
            f"You exceeded your monthly token quota: {result.quota_used} of {quota} tokens "
            f"used. It resets on {when}; ask your administrator to raise it."
        )
    else:
        message = (
            f"This request needs up to {tokens} tokens (prompt plus max_tokens for each "
            f"choice) but only {remaining} of your monthly quota of {quota} tokens remain "
            f"until {when}. Lower max_tokens or ask your administrator to raise the quota."
        )
    headers = result.headers()
    headers["retry-after"] = str(max(1, math.ceil((resets - now).total_seconds())))
    headers.pop("retry-after-ms", None)
    headers["x-should-retry"] = "false"
    return HttpError(
        429, message, type="insufficient_quota", code="insufficient_quota", headers=headers
    )
