"""Verified API keys, kept in the gateway so a request with a known key costs no database
query.

An entry is the `KeyUse` the database answered for one key (looked up by the key's sha256,
never the key itself), kept under the auth generation it was read at (`AUTH_GEN_KEY` in Redis,
bumped when a key is revoked or a tenant suspended, deleted or given new limits:
`services.auth_events`) and for at most `ttl_s`, the bound when a bump is lost. Reading the
generation is one Redis GET; when Redis cannot answer, nothing cached is trusted.
Unknown, revoked and suspended keys are never cached: each such request asks the database.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from loraplex.platform.services.api_keys import TOUCH_INTERVAL, KeyUse
from loraplex.platform.services.auth_events import AUTH_GEN_KEY

MAX_KEYS = 20_000


@dataclass
class _Entry:
    use: KeyUse
    generation: bytes | None
    expires: float
    touched: float  # when the key's last use was last written (`touch_last_used`)


class KeyCache:
    """`KeyUse` per key digest, valid while the auth generation stands (bounded LRU)."""

    def __init__(self, redis: Redis, ttl_s: float, max_keys: int = MAX_KEYS) -> None:
        self._redis = redis
        self._ttl = ttl_s
        self._max = max_keys
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """Whether keys are kept at all (a TTL of 0 turns the cache off)."""
        return self._ttl > 0

    async def generation(self) -> bytes | None:
        """The current auth generation (None: Redis did not answer; trust no entry)."""
        if not self.enabled:
            return None
        try:
            return self.as_generation(await self._redis.get(AUTH_GEN_KEY))
        except RedisError:
            return None

    @staticmethod
    def as_generation(raw: bytes | str | None) -> bytes:
        """The auth generation from the value of `AUTH_GEN_KEY` (never bumped: `b"0"`)."""
        if raw is None:
            return b"0"
        return raw if isinstance(raw, bytes) else str(raw).encode()

    def tenant_of(self, digest: str) -> uuid.UUID | None:
        """The tenant of the key with `digest` if it is kept, valid or not (for reading that
        tenant's state in the same round trip as the generation that validates it)."""
        entry = self._entries.get(digest)
        return entry.use.tenant_id if entry is not None else None

    def get(self, digest: str, generation: bytes | None) -> KeyUse | None:
        """The cached use of the key with `digest`, if still valid at `generation`."""
        entry = self._entries.get(digest)
        if entry is None or generation is None:
            return None
        if entry.generation != generation or entry.expires <= time.monotonic():
            del self._entries[digest]
            return None
        self._entries.move_to_end(digest)
        return entry.use

    def put(self, digest: str, generation: bytes | None, use: KeyUse) -> None:
        """Keep a key the database just verified (and whose use it just recorded)."""
        if generation is None:
            return
        now = time.monotonic()
        self._entries[digest] = _Entry(use, generation, now + self._ttl, now)
        self._entries.move_to_end(digest)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def due_for_touch(self, digest: str) -> bool:
        """Whether the key's last-use time should be written now (at most once per
        `TOUCH_INTERVAL`, as the database path does); marks it written."""
        entry = self._entries.get(digest)
        now = time.monotonic()
        if entry is None or now - entry.touched < TOUCH_INTERVAL.total_seconds():
            return False
        entry.touched = now
        return True
