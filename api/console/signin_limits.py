"""Sign-in limits, kept in Redis so every API process counts the same failures.

Per account: the first `console_signin_failures` failures in a window are free; after that
each failure doubles the wait before the account's next attempt (1 s, 2 s, 4 s, ... up to
`console_signin_max_delay_s`). A delay, never a lock: whoever knows the password gets in once
the wait is over, so a stranger cannot lock an operator out.

Per client address: `console_signin_address_failures` failures in a window, then 429 until it
ends. The address is the peer's, or, when the peer is one of `console_trusted_proxies`, the
right-most address of `X-Forwarded-For` that is not itself a trusted proxy (a client cannot
pick its own address by sending the header).

A refused attempt is answered after the pause refused tenants get (`rate_limited_delay_s`,
at most `rate_limited_held` held per address; `gateway/refusal_pause.py`): a flood from one
address waits instead of costing a request's CPU at the rate it can send.

Without Redis (an API with no `redis_url` nor Redis broker) the same counts are kept in this
process, and that is logged once."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import redis

from loraplex.platform.gateway.refusal_pause import RefusalPause
from loraplex.platform.settings import Settings

log = logging.getLogger("loraplex.console")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Counter(Protocol):
    """The store's two operations: one failure counted, and the state of a key."""

    def failed(self, key: str, window_s: int, now: float) -> None:
        """Count a failure on `key` (its count and last time; expires after a quiet window)."""

    def state(self, key: str) -> tuple[int, float]:
        """(failures in the window, time of the last one)."""

    def clear(self, key: str) -> None:
        """Forget `key` (a successful sign-in)."""


class RedisCounter:
    """Failures in a Redis hash per key: `n` and `last`, expiring `window_s` after the last."""

    def __init__(self, url: str, namespace: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=5)
        self.ns = namespace

    def failed(self, key: str, window_s: int, now: float) -> None:
        """Count one failure (one round trip)."""
        k = f"{self.ns}:{key}"
        pipe = self.client.pipeline()
        pipe.hincrby(k, "n", 1)
        pipe.hset(k, "last", repr(now))
        pipe.expire(k, window_s)
        pipe.execute()

    def state(self, key: str) -> tuple[int, float]:
        """(failures, last failure time)."""
        n, last = self.client.hmget(f"{self.ns}:{key}", ["n", "last"])
        return int(n or 0), float(last or 0.0)

    def clear(self, key: str) -> None:
        """Forget the key."""
        self.client.delete(f"{self.ns}:{key}")


class MemoryCounter:
    """The same counts in this process (only where there is no Redis)."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[int, float, float]] = {}
        self._lock = threading.Lock()

    def failed(self, key: str, window_s: int, now: float) -> None:
        """Count one failure."""
        with self._lock:
            n, _, expires = self._data.get(key, (0, 0.0, 0.0))
            n = n + 1 if expires > now else 1
            self._data[key] = (n, now, now + window_s)
            if len(self._data) > 100_000:  # bound memory under a spray of addresses
                self._data = {k: v for k, v in self._data.items() if v[2] > now}

    def state(self, key: str) -> tuple[int, float]:
        """(failures, last failure time)."""
        with self._lock:
            n, last, expires = self._data.get(key, (0, 0.0, 0.0))
        return (n, last) if expires > time.time() else (0, 0.0)

    def clear(self, key: str) -> None:
        """Forget the key."""
        with self._lock:
            self._data.pop(key, None)


def trusted_networks(proxies: list[str]) -> list[Network]:
    """The trusted proxies as networks (a bare address is a /32 or /128)."""
    return [ipaddress.ip_network(p.strip(), strict=False) for p in proxies if p.strip()]


def _is_trusted(address: str, networks: list[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)


def client_address(peer: str, forwarded_for: str | None, networks: list[Network]) -> str:
    """The client's address: the peer, unless the peer is a trusted proxy; then the right-most
    X-Forwarded-For entry that is not a trusted proxy (the left-most when all are)."""
    if not forwarded_for or not _is_trusted(peer, networks):
        return peer
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()][-32:]
    for hop in reversed(hops):
        if not _is_trusted(hop, networks):
            return hop[:64]
    return hops[0][:64] if hops else peer


@dataclass(frozen=True)
class Refusal:
    """Why an attempt may not go ahead now, and for how many seconds."""

    message: str
    retry_after: int


class SignInLimits:
    """The account delay and the address limit over one Counter."""

    def __init__(self, settings: Settings, counter: Counter) -> None:
        self.free = settings.console_signin_failures
        self.window_s = settings.console_signin_window_s
        self.max_delay_s = settings.console_signin_max_delay_s
        self.address_limit = settings.console_signin_address_failures
        self.networks = trusted_networks(settings.console_trusted_proxies)
        self.counter = counter
        self.pause = RefusalPause(settings.rate_limited_delay_s, settings.rate_limited_held)

    def delay_s(self, failures: int) -> float:
        """The wait after `failures` failures of one account (0 while they are free)."""
        if failures < self.free:
            return 0.0
        return float(min(self.max_delay_s, 2 ** (failures - self.free)))

    def check(self, account: str, address: str) -> Refusal | None:
        """None when the attempt may go ahead."""
        now = time.time()
        n_addr, last_addr = self.counter.state("addr:" + address)
        if n_addr >= self.address_limit:
            wait = max(1, math.ceil(last_addr + self.window_s - now))
            return Refusal(f"Too many failed sign-ins from your address; try again in {wait} "
                           "seconds.", wait)  # fmt: skip
        n, last = self.counter.state("acct:" + account)
        wait_s = last + self.delay_s(n) - now
        if wait_s > 0:
            wait = max(1, math.ceil(wait_s - 0.05))
            return Refusal(f"Too many failed sign-ins for this account; try again in {wait} "
                           "seconds.", wait)  # fmt: skip
        return None

    def failed(self, account: str, address: str) -> None:
        """Count a failure against both."""
        now = time.time()
        self.counter.failed("acct:" + account, self.window_s, now)
        self.counter.failed("addr:" + address, self.window_s, now)

    def succeeded(self, account: str) -> None:
        """A right password: the account's failures are forgotten."""
        self.counter.clear("acct:" + account)


def limits_for(settings: Settings) -> SignInLimits:
    """Limits over Redis (namespaced by the database, i.e. by deployment), else in process."""
    url = settings.gateway_redis_url()
    if url is None:
        log.warning("console sign-in limits are per process: no Redis is configured")
        return SignInLimits(settings, MemoryCounter())
    db = hashlib.sha256((settings.database_url or "").encode()).hexdigest()[:16]
    return SignInLimits(settings, RedisCounter(url, f"loraplex:console-signin:{db}"))
