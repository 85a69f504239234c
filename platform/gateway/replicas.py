"""The replica registry: engine replicas announce themselves per deployment with a heartbeat
in Redis; the gateway lists the live ones. A replica that stops beating expires after its TTL.

Layout: `{prefix}:dep:{deployment}` is a sorted set of replica ids scored by expiry time (ms);
`{prefix}:rep:{id}` holds the replica's JSON record with the same TTL. A replica that has been
started but is not ready yet (loading weights, capturing graphs) beats into
`{prefix}:starting:{deployment}` instead, so the gateway can wait for it (cold start) rather
than answer 503 at once.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import redis as sync_redis
from redis.asyncio import Redis

DEFAULT_PREFIX = "loraplex:replicas"
DEFAULT_TTL_S = 10.0
STARTING_POLL_S = 0.25
DEFAULT_BUSY_GRACE_S = 60.0
"""How long a ready replica whose health check times out (busy, not refusing) stays registered."""


@dataclass(frozen=True)
class ReplicaInfo:
    """How to reach one engine replica and which deployment it serves."""

    deployment: str
    url: str
    replica_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    model: str | None = None

    def to_json(self) -> str:
        """Serialized record."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str | bytes) -> ReplicaInfo:
        """Parse a stored record."""
        return cls(**json.loads(raw))


def _dep_key(prefix: str, deployment: str) -> str:
    return f"{prefix}:dep:{deployment}"


def _rep_key(prefix: str, replica_id: str) -> str:
    return f"{prefix}:rep:{replica_id}"


def _starting_key(prefix: str, deployment: str) -> str:
    return f"{prefix}:starting:{deployment}"


def beat(
    client: sync_redis.Redis,
    info: ReplicaInfo,
    ttl_s: float = DEFAULT_TTL_S,
    prefix: str = DEFAULT_PREFIX,
) -> None:
    """Register or refresh `info` for `ttl_s` seconds (synchronous; used by replicas)."""
    expires_ms = int((time.time() + ttl_s) * 1000)
    pipe = client.pipeline()
    pipe.set(_rep_key(prefix, info.replica_id), info.to_json(), px=int(ttl_s * 1000))
    pipe.zadd(_dep_key(prefix, info.deployment), {info.replica_id: expires_ms})
    pipe.zrem(_starting_key(prefix, info.deployment), info.replica_id)
    pipe.execute()


def beat_starting(
    client: sync_redis.Redis,
    info: ReplicaInfo,
    ttl_s: float = DEFAULT_TTL_S,
    prefix: str = DEFAULT_PREFIX,
) -> None:
    """Announce `info` as starting (not ready yet) for `ttl_s` seconds."""
    expires_ms = int((time.time() + ttl_s) * 1000)
    client.zadd(_starting_key(prefix, info.deployment), {info.replica_id: expires_ms})


def deregister(client: sync_redis.Redis, info: ReplicaInfo, prefix: str = DEFAULT_PREFIX) -> None:
    """Remove `info` at once (a replica shutting down cleanly)."""
    pipe = client.pipeline()
    pipe.delete(_rep_key(prefix, info.replica_id))
    pipe.zrem(_dep_key(prefix, info.deployment), info.replica_id)
    pipe.zrem(_starting_key(prefix, info.deployment), info.replica_id)
    pipe.execute()


class Heartbeat:
    """A daemon thread that keeps one replica registered until `stop()`: announced as
    starting until its first healthy check, then live while healthy."""

    def __init__(
        self,
        redis_url: str,
        info: ReplicaInfo,
        ttl_s: float = DEFAULT_TTL_S,
        interval_s: float | None = None,
        prefix: str = DEFAULT_PREFIX,
        healthy: Callable[[], bool | None] | None = None,
        busy_grace_s: float = DEFAULT_BUSY_GRACE_S,
    ) -> None:
        self.info = info
        self._healthy = healthy
        self._busy_grace = busy_grace_s
        self._last_healthy = time.monotonic()
        self._client = sync_redis.Redis.from_url(redis_url)
        self._ttl = ttl_s
        self._interval = interval_s if interval_s is not None else ttl_s / 3
        self._prefix = prefix
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-heartbeat", daemon=True)
        self.ready = threading.Event()  # set at the first healthy beat

    def start(self) -> Heartbeat:
        """Register now (if healthy) and keep beating in the background."""
        self._beat_once()
        self._thread.start()
        return self

    def _alive(self) -> bool:
        """Healthy now, or (once ready) busy for less than `busy_grace_s` since the last
        healthy answer: a replica slowed by load keeps its registration, a hung one loses it."""
        answer = True if self._healthy is None else self._healthy()
        now = time.monotonic()
        if answer:
            self._last_healthy = now
            return True
        return (
            answer is None and self.ready.is_set() and now - self._last_healthy < self._busy_grace
        )

    def _beat_once(self) -> None:
        try:
            if self._alive():
                beat(self._client, self.info, self._ttl, self._prefix)
                self.ready.set()
            elif not self.ready.is_set():
                beat_starting(self._client, self.info, self._ttl, self._prefix)
        except sync_redis.RedisError:
            pass  # Redis blip: try again next interval; the TTL covers the gap.

    def _run(self) -> None:
        # While starting, check often: a request waiting for this replica should not also
        # wait out a whole beat interval after it is ready.
        while not self._stop.wait(self._interval if self.ready.is_set() else STARTING_POLL_S):
            self._beat_once()

    def stop(self, deregister_now: bool = True) -> None:
        """Stop beating; by default also remove the record at once."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if deregister_now:
            with contextlib.suppress(sync_redis.RedisError):
                deregister(self._client, self.info, self._prefix)
        self._client.close()


def http_health_check(url: str, timeout_s: float = 2.0) -> Callable[[], bool | None]:
    """A probe for `Heartbeat(healthy=...)`: True when the replica's `GET /health` answers
    200, False when it answers otherwise or refuses the connection, None when it accepted
    the connection but did not answer in time (busy: its loop holds the CPU)."""
    import httpx

    def check() -> bool | None:
        try:
            return httpx.get(f"{url}/health", timeout=timeout_s).status_code == 200
        except httpx.ReadTimeout:
            return None
        except httpx.HTTPError:
            return False

    return check


# KEYS[1]: a deployment's sorted set; ARGV[1]: now (ms); ARGV[2]: the records' key prefix.
# Prunes the expired ids, then answers the records of the others that still exist.
_LIVE_RECORDS = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local raw = redis.call('GET', ARGV[2] .. id)
  if raw then out[#out + 1] = raw end
end
return out
"""


class ReplicaRegistry:
    """The gateway's read side: live replicas of a deployment (stale ones pruned)."""

    def __init__(self, redis: Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self._redis = redis
        self._prefix = prefix
        self._live_records = redis.register_script(_LIVE_RECORDS)

    async def live(self, deployment: str) -> list[ReplicaInfo]:
        """Replicas of `deployment` whose heartbeat has not expired: one round trip (every
        request routes through this; three waits on Redis were three chances to queue
        behind other work on a busy core)."""
        now_ms = int(time.time() * 1000)
        raws = await self._live_records(
            keys=[_dep_key(self._prefix, deployment)], args=[now_ms, _rep_key(self._prefix, "")]
        )
        return [ReplicaInfo.from_json(r) for r in raws]

    async def starting(self, deployment: str) -> int:
        """How many replicas of `deployment` are starting (announced, not ready yet)."""
        key = _starting_key(self._prefix, deployment)
        await self._redis.zremrangebyscore(key, "-inf", int(time.time() * 1000))
        return int(await self._redis.zcard(key))

    async def announce_starting(self, info: ReplicaInfo, ttl_s: float = DEFAULT_TTL_S) -> None:
        """Async `beat_starting` (tests and in-process replicas)."""
        expires_ms = int((time.time() + ttl_s) * 1000)
        await self._redis.zadd(_starting_key(self._prefix, info.deployment),
                               {info.replica_id: expires_ms})  # fmt: skip

    async def register(self, info: ReplicaInfo, ttl_s: float = DEFAULT_TTL_S) -> None:
        """Async registration (tests and in-process replicas)."""
        expires_ms = int((time.time() + ttl_s) * 1000)
        pipe = self._redis.pipeline()
        pipe.set(_rep_key(self._prefix, info.replica_id), info.to_json(), px=int(ttl_s * 1000))
        pipe.zadd(_dep_key(self._prefix, info.deployment), {info.replica_id: expires_ms})
        pipe.zrem(_starting_key(self._prefix, info.deployment), info.replica_id)
        await pipe.execute()

    async def remove(self, info: ReplicaInfo) -> None:
        """Drop a replica record at once."""
        pipe = self._redis.pipeline()
        pipe.delete(_rep_key(self._prefix, info.replica_id))
        pipe.zrem(_dep_key(self._prefix, info.deployment), info.replica_id)
        pipe.zrem(_starting_key(self._prefix, info.deployment), info.replica_id)
        await pipe.execute()
