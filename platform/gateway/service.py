"""The gateway's long-lived parts, built once per app from `Settings`: Redis, the model
resolver, rate limiter, replica registry and router, usage recorder, and the per-base-model
assets (tokenizer and chat template files fetched from object storage on first use).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import httpx
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.gateway.adapter_warmer import AdapterWarmer
from loraplex.platform.gateway.assets import AssetCache, ModelAssets, fetch_model_assets
from loraplex.platform.gateway.key_cache import KeyCache
from loraplex.platform.gateway.parse_process import ParseProcess
from loraplex.platform.gateway.ratelimit import RateLimiter
from loraplex.platform.gateway.refusal_pause import RefusalPause
from loraplex.platform.gateway.replica_client import ReplicaClient
from loraplex.platform.gateway.replicas import ReplicaRegistry
from loraplex.platform.gateway.resolve import Generation, ModelResolver, ResolvedModel
from loraplex.platform.gateway.router import Router
from loraplex.platform.gateway.single_flight import SingleFlight
from loraplex.platform.gateway.streaming import drain_background, spawn
from loraplex.platform.gateway.text_work import TextWorkers
from loraplex.platform.gateway.usage import UsageRecorder
from loraplex.platform.services.api_keys import (
    KeyUse,
    hash_key,
    looks_like_key,
    touch_key_use,
    use_api_key,
)
from loraplex.platform.services.auth_events import AUTH_GEN_KEY
from loraplex.platform.settings import Settings

REDIS_POOL_SIZE = 64
REDIS_POOL_WAIT_S = 10.0


class Gateway:
    """Everything a request handler needs; `start()` on app startup, `close()` on shutdown."""

    def __init__(
        self,
        settings: Settings,
        redis: Redis,
        session_factory: sessionmaker[Session],
        s3_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.settings = settings
        self.redis = redis
        self.session_factory = session_factory
        self._s3_factory = s3_factory
        self.http = httpx.AsyncClient(limits=httpx.Limits(max_connections=1000))
        self.resolver = ModelResolver(redis, ttl_s=settings.resolve_cache_ttl_s)
        self.limiter = RateLimiter(redis, burst_ms=settings.rate_limit_burst_s * 1000)
        # the adapter API's requests: the same limits, a budget of their own (`api/deps.py`)
        self.api_limiter = RateLimiter(
            redis, prefix="loraplex:rl-api", burst_ms=settings.rate_limit_burst_s * 1000
        )
        self.registry = ReplicaRegistry(redis)
        if not settings.replica_secret:
            raise RuntimeError("the gateway needs LORAPLEX_REPLICA_SECRET to reach replicas")
        self.replica_secret = settings.replica_secret
        self.client = ReplicaClient(
            self.http, settings.replica_secret, read_timeout_s=settings.replica_read_timeout_s
        )
        self.router = Router(self.registry, self.client, hold_at_zero=settings.gateway_hold_at_zero)
        self.warmer = AdapterWarmer(
            redis, session_factory, self.resolver, self.router, self.client,
            settings.warm_replicas,
        )  # fmt: skip
        self.usage = UsageRecorder(
            session_factory,
            batch_size=settings.usage_batch_size,
            interval_s=settings.usage_flush_interval_s,
        )
        self.assets = AssetCache()
        self.keys = KeyCache(redis, settings.api_key_cache_ttl_s)
        # requests with one key arriving together, uncached, verify it once
        self._verifying: SingleFlight[tuple[str, bytes | None], KeyUse | None] = SingleFlight()
        self.refusals = RefusalPause(settings.rate_limited_delay_s, settings.rate_limited_held)
        # large bodies: parsed away from this process's GIL (the parser loaded as it starts)
        self.parser = ParseProcess(preload="loraplex.platform.gateway.request_parsing")
        self.text = TextWorkers(settings.text_workers, settings.text_queue_limit)

    @classmethod
    def from_settings(cls, settings: Settings) -> Gateway:
        """Build from settings (database URL and Redis required)."""
        from loraplex.platform.db.session import make_sessionmaker
        from loraplex.platform.services.objects import s3_client

        redis_url = settings.gateway_redis_url()
        if not settings.database_url or not redis_url:
            raise RuntimeError("the gateway needs LORAPLEX_DATABASE_URL and LORAPLEX_REDIS_URL")
        # Bursts of requests wait for a pooled connection (the rate limiter's scripts are
        # short) instead of failing: a plain pool raised "Too many connections", which
        # answered 503 to most of 200 concurrent streams (`loraplex bench load`).
        pool = BlockingConnectionPool.from_url(
            redis_url, max_connections=REDIS_POOL_SIZE, timeout=REDIS_POOL_WAIT_S
        )
        return cls(
            settings,
            Redis.from_pool(pool),  # the client owns (and closes) the pool
            make_sessionmaker(settings.database_url),
            lambda: s3_client(settings),
        )

    async def start(self) -> None:
        """Start background work (usage flusher, adapter warming, the parse process)."""
        self.usage.start()
        self.warmer.start()
        self.parser.start()

    async def close(self) -> None:
        """Flush usage, let pending replica aborts go out, and close connections."""
        await self.warmer.close()
        await self.usage.stop()
        await drain_background()
        await self.http.aclose()
        await self.redis.aclose()
        self.text.close()
        self.parser.close()

    async def key_use(self, token: str) -> KeyUse | None:
        """The live key `token` and its tenant's limits (None: unknown or revoked; raises
        `TenantSuspended`): from the key cache, else verified (and its use recorded) in the
        database, off the event loop."""
        return (await self.key_check(token))[0]

    async def key_check(self, token: str) -> tuple[KeyUse | None, Generation | None]:
        """`key_use`, and for a key the cache knows, its tenant's resolution generation read
        in the same round trip to Redis (None: not read; `resolver.resolve` reads it then)."""
        if not looks_like_key(token):
            return None, None  # not one of ours: no query
        digest = hash_key(token)
        generation, names = await self._generations(self.keys.tenant_of(digest))
        use = self.keys.get(digest, generation)
        if use is not None:
            if self.keys.due_for_touch(digest):
                spawn(asyncio.to_thread(touch_key_use, self.session_factory, use.key_id))
            return use, names
        use = await self._verifying.run(
            (digest, generation), lambda: self._verify(token, digest, generation)
        )
        return use, None

    async def _generations(
        self, tenant_id: uuid.UUID | None
    ) -> tuple[bytes | None, Generation | None]:
        """The auth generation (None: trust no kept key) and, when `tenant_id` is known,
        that tenant's resolution generation: one MGET instead of two GETs on every request."""
        if tenant_id is None or not self.keys.enabled:
            return await self.keys.generation(), None
        try:
            auth, names = await self.redis.mget(
                [AUTH_GEN_KEY, self.resolver.generation_key(tenant_id)]
            )
        except RedisError:
            return None, None
        # the gateway's client does not decode responses: bytes (or None), never str
        return self.keys.as_generation(auth), Generation(cast("bytes | None", names))

    async def _verify(self, token: str, digest: str, generation: bytes | None) -> KeyUse | None:
        use = await asyncio.to_thread(use_api_key, self.session_factory, token)
        if use is not None:
            self.keys.put(digest, generation, use)
        return use

    def _locate(self, resolved: ResolvedModel) -> Path:
        if self._s3_factory is None:
            raise RuntimeError("no object storage configured to fetch the model's tokenizer")
        dest = self.settings.data_dir / "gateway" / "models" / str(resolved.base_model_id)
        return fetch_model_assets(
            self._s3_factory(), self.settings.s3_bucket, resolved.base_object_prefix, dest
        )

    async def model_assets(self, resolved: ResolvedModel) -> ModelAssets:
        """Tokenizer, template and limits of the base model behind `resolved`."""
        key = str(resolved.base_model_id)
        loaded = self.assets.loaded(key)
        if loaded is not None:
            return loaded  # the common case: no thread hop
        return await asyncio.to_thread(self.assets.get, key, lambda: self._locate(resolved))
